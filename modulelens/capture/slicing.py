"""Batch-sliced capture: a call whose activations are over the budget keeps its first batch rows.

See :mod:`modulelens.capture.budget` for the policy. :class:`RowSlicer` does the work once the real
call has run: for each candidate batch dimension it runs the module again on the first rows of the
snapshotted inputs, on the weights, buffers and RNG state the real call started with (the module's
own tensors are not touched: they are substituted for the run), and keeps that run as the capture
when its output matches the same rows of the real output. With backward, :meth:`slice_gradients`
makes the gradients agree with the slice: the gradients flowing into the outputs are cut to the same
rows, the module is run forward and backward on the slice, and the input gradients must match the
same rows of the real ones (else gradients are dropped, with the reason); parameter gradients are
those of the slice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from modulelens.capture.budget import BatchDim, SliceSink, batch_candidates, first_rows, human_bytes, rows_within
from modulelens.capture.call import (
    CapturedCall,
    autocast_regions,
    call_input,
    rng_states,
    set_rng_states,
    stats_specs,
)
from modulelens.capture.leafcall import BUFFER_PREFIX, LeafSource, call_state, changed_state
from modulelens.capture.manifest import ActivationStorage
from modulelens.capture.sharded import is_sharded, substituted
from modulelens.capture.sources import Resolver
from modulelens.capture.spec_walk import tensor_leaves
from modulelens.capture.values import Decoder, Encoder, TensorSink, Unrecorded, flatten, keyed_tensors
from modulelens.numerics import diff, tolerances


@dataclass
class Presliced:
    """Inputs snapshotted before the call as their first ``sink.rows`` rows along one candidate
    batch dimension (the inputs alone were over the budget)."""

    sink: SliceSink
    args_spec: Any
    kwargs_spec: Any
    found: list[Unrecorded]


def preslice(args: tuple, kwargs: dict, candidates: list[BatchDim], in_bytes: int, budget: int,
             max_tensor_bytes: int | None, module_spec: Any) -> dict[int, Presliced]:
    """Snapshot the first rows of the inputs along each candidate dimension, within the budget
    together (the module decides later which dimension holds the batch)."""
    share = max(1, budget // max(len(candidates), 1))
    out = {}
    for batch in candidates:
        sink = SliceSink(rows_within(batch.size, 2 * in_bytes, share), batch, max_tensor_bytes)
        enc = Encoder(sink, module_spec)
        out[batch.dim] = Presliced(sink, enc.encode(list(args), "args"), enc.encode(dict(kwargs), "kwargs"), enc.found)
    return out


class RowSlicer:
    """Stores a call that is over the budget (see the module docstring). ``forward(module, args,
    kwargs)`` runs the module without the tracer; ``store_outputs(out, captured, sink)`` encodes an
    output into the capture."""

    def __init__(self, module: nn.Module, captured: CapturedCall, forward: Callable[..., Any],
                 store_outputs: Callable[[Any, CapturedCall, TensorSink], None], max_tensor_bytes: int | None,
                 module_spec: Any = None):
        self.module, self.captured = module, captured
        self.forward, self.store_outputs = forward, store_outputs
        self.max_tensor_bytes, self.module_spec = max_tensor_bytes, module_spec

    # -- forward ------------------------------------------------------------------------------
    def store(self, args: tuple, kwargs: dict, out: Any, inputs: list[torch.Tensor], total: int, budget: int,
              presliced: dict[int, Presliced]) -> None:
        """Keep the first batch rows when the module treats rows independently along a dimension
        found from the run, else store shape-only with statistics. Says which and why."""
        c = self.captured
        _, out_tensors = keyed_tensors(out, "output")
        over = f"the activations total {human_bytes(total)}, over what the budget leaves for them ({human_bytes(budget)})"
        candidates = batch_candidates(inputs, list(out_tensors.values()))
        tried: list[str] = []
        worst = None
        if not candidates:
            tried.append("no dimension 0 or 1 of the first input (2 or more rows) is found in every output tensor")
        elif not presliced and c.inputs_sink.shape_only:
            tried.append("some inputs are over the per-tensor limit and were not snapshotted")
            candidates = []
        for batch in candidates:
            if presliced and batch.dim not in presliced:
                continue
            pre = presliced.get(batch.dim)
            rows = pre.sink.rows if pre is not None else rows_within(batch.size, total, budget)
            why, worst = self._capture_rows(out_tensors, batch, rows, pre)
            if why is None:
                after = f" (tried first {'; '.join(tried)})" if tried else ""
                c.activations = ActivationStorage(
                    mode="batch_slice", budget_bytes=budget, total_bytes=total, rows=rows, batch_rows=batch.size,
                    batch_dim=batch.dim, check_max_abs_error=worst,
                    reason=f"{over}; the module treats batch rows independently along dimension {batch.dim} (its "
                    f"output on the first {rows} rows matched those rows of the real output), so the first {rows} of "
                    f"{batch.size} rows are stored and replay is exact on them{after}")
                return
            tried.append(f"along dimension {batch.dim}: {why}")
        if presliced or isinstance(c.inputs_sink, SliceSink):
            c.args_spec, c.kwargs_spec, c.inputs_sink = stats_specs(args, kwargs)
        self.store_outputs(out, c, TensorSink("", 0))
        c.activations = ActivationStorage(
            mode="shape_only", budget_bytes=budget, total_bytes=total,
            batch_rows=candidates[0].size if candidates else None, check_max_abs_error=worst,
            reason=f"{over}; {'; '.join(tried)}: tensors are stored shape-only with statistics and replay cannot "
            "compare outputs")

    def _weights_of_the_call(self, params: bool) -> dict[str, torch.Tensor]:
        """The captured buffers (copies: a forward may change them) and, with ``params``, parameters
        (new leaves sharing the captured data), on the module's devices, to run the module on as the
        real call started. Sharded parameters are always given (the module holds only shards outside
        its forward); without ``params`` the others are the module's own (unchanged since the call)."""
        c, out = self.captured, {}
        live = dict(self.module.named_parameters())
        for name, t in c.weights.items():
            device = c.weight_specs[name].get("device", "cpu")
            if name not in live:
                out[name] = t.to(device, copy=True)
            elif params or is_sharded(live[name]):
                out[name] = t.detach().to(device).requires_grad_(live[name].requires_grad)
        # a tensor registered under several names (tied weights) is stored under its first one
        first = {id(t): n for n, t in [*self.module.named_parameters(), *self.module.named_buffers()]}
        for name, t in [*self.module.named_parameters(remove_duplicate=False),
                        *self.module.named_buffers(remove_duplicate=False)]:
            if name not in out and first.get(id(t)) in out:
                out[name] = out[first[id(t)]]
        return out

    def _sliced_inputs(self, sink: TensorSink, args_spec: Any, kwargs_spec: Any, batch: BatchDim | None, rows: int,
                       leaves: dict[int, torch.Tensor] | None = None) -> tuple[list[Any], dict[str, Any]]:
        """The call's arguments rebuilt from the snapshot, cut to their first ``rows`` rows along
        ``batch`` (whole when None), each input given as it was in the run."""
        tensors = sink.tensors
        if batch is not None:
            batched = sink.sliced if isinstance(sink, SliceSink) else {k for k, t in tensors.items() if batch.holds(t)}
            tensors = first_rows(tensors, batched, batch, rows)
        specs = {s.key: s for s in tensor_leaves(args_spec) + tensor_leaves(kwargs_spec)}
        given = {key: call_input(specs[key], t, leaves=leaves) for key, t in tensors.items()}
        decoder = Decoder(LeafSource(given), Resolver())
        return list(decoder.decode(args_spec)), dict(decoder.decode(kwargs_spec))

    def _capture_rows(self, out_tensors: dict[str, torch.Tensor], batch: BatchDim, rows: int,
                      pre: Presliced | None) -> tuple[str | None, float]:
        """Run the module on the first ``rows`` rows of the snapshotted inputs, from the weights, buffers
        and RNG state the real call started with; when that output matches the same rows of the real
        output, store the sliced run as the capture (inputs, outputs, changed state). Returns why not
        (None when stored) and the largest difference found. The module and the RNG are left as the
        real call left them."""
        c = self.captured
        sink, args_spec, kwargs_spec = (pre.sink, pre.args_spec, pre.kwargs_spec) if pre else (
            c.inputs_sink, c.args_spec, c.kwargs_spec)
        args, kwargs = self._sliced_inputs(sink, args_spec, kwargs_spec, batch, rows)
        in_sink = TensorSink("", self.max_tensor_bytes)
        enc = Encoder(in_sink, self.module_spec)
        new_args_spec, new_kwargs_spec = enc.encode(list(args), "args"), enc.encode(dict(kwargs), "kwargs")
        rng_after = rng_states()
        try:
            set_rng_states(c.rng)
            with substituted(self.module, self._weights_of_the_call(params=False)), torch.set_grad_enabled(c.grad_enabled):
                try:
                    sliced_out = self.forward(self.module, list(args), dict(kwargs))
                except Exception as e:  # noqa: BLE001 - a module that cannot run on the slice is not sliced
                    return f"the module fails on the first {rows} rows ({type(e).__name__}: {str(e)[:200]})", 0.0
                state = call_state(self.module, args, kwargs)
            _, sliced = keyed_tensors(sliced_out, "output")
            worst, ok = 0.0, sliced.keys() == out_tensors.keys()
            for key, t in sliced.items() if ok else ():
                real = batch.first(out_tensors[key], rows)
                if t.shape != real.shape:
                    ok = False
                    break
                d = diff(t, real, *tolerances(t.dtype))
                worst, ok = max(worst, d.max_abs_error), ok and d.allclose
            if not ok:
                return (f"the module does not treat batch rows independently (on the first {rows} rows its output "
                        f"differs from those rows of the real output by up to {worst:.3g}; BatchNorm in training "
                        "mode and other batch statistics do this)"), worst
            c.inputs_sink, c.args_spec, c.kwargs_spec = in_sink, new_args_spec, new_kwargs_spec
            self.store_outputs(sliced_out, c, TensorSink("", self.max_tensor_bytes))
            before = dict(in_sink.tensors)
            before.update({BUFFER_PREFIX + n: t for n, t in c.weights.items()})
            skip = {BUFFER_PREFIX + n for n in c.weights_shape_only}
            for key, t in changed_state(before, {k: v for k, v in state.items() if k not in skip}).items():
                c.state_sink.add(key, t)
            return None, worst
        finally:
            set_rng_states(rng_after)

    # -- backward -----------------------------------------------------------------------------
    def rerun_gradients(self) -> None:
        """Input and parameter gradients of a module whose backward hook could not be used: run it
        again on the captured inputs (the stored rows, when batch-sliced) with the gradient that
        reached its outputs (cut to those rows)."""
        c = self.captured
        if c.grad_output is None:
            return
        act = c.activations
        batch, rows = None, 0
        if act is not None and act.mode == "batch_slice" and act.rows is not None:
            batch, rows = BatchDim(act.batch_dim, act.batch_rows or 0), act.rows
            c.grad_output = [batch.first(g, rows) if g is not None and batch.holds(g) else g for g in c.grad_output]
        why = self._recompute(batch, rows, c.grad_output, []) if not c.weights_shape_only else \
            "the weights were stored shape-only"
        if why is not None:
            c.grad_output = None
            c.backward_notes.append(f"gradients were not kept: {why}")
            return
        c.backward_notes.append("the module changes an input in place, which its backward hook forbids: input and "
                                "parameter gradients were computed by running it again on the captured inputs with "
                                "the gradient that reached its outputs")

    def slice_gradients(self) -> None:
        """Make the captured gradients those of the stored slice (see the module docstring)."""
        c = self.captured
        act = c.activations
        if act is None or act.mode != "batch_slice" or c.grad_output is None or act.rows is None:
            return
        batch, rows = BatchDim(act.batch_dim, act.batch_rows or 0), act.rows
        cut = [batch.first(g, rows) if g is not None and batch.holds(g) else g for g in c.grad_output]
        real_inputs = c.grad_input or []
        if c.weights_shape_only:
            c.grad_output = cut
            c.grad_input = [batch.first(g, rows) if g is not None and batch.holds(g) else g for g in real_inputs]
            c.param_grads = {}
            c.backward_notes.append("the weights were stored shape-only: parameter gradients of the slice cannot "
                                    "be computed and are not compared; input gradients are the real ones' rows")
            return
        why = self._recompute(batch, rows, cut, real_inputs)
        if why is not None:
            c.grad_output = c.grad_input = None
            c.param_grads = {}
            c.backward_notes.append(f"gradients were not kept: {why}")

    def _recompute(self, batch: BatchDim | None, rows: int, grad_output: list[torch.Tensor | None],
                   real_inputs: list[torch.Tensor | None]) -> str | None:
        """Run the module forward and backward on the captured inputs (their first ``rows`` rows
        along ``batch``; all of them when None) from the captured weights and RNG state, with
        ``grad_output``; keep the gradients it gives. Input gradients must match the same rows of
        ``real_inputs`` (when given). Returns why not, or None."""
        c = self.captured
        leaves: dict[int, torch.Tensor] = {}
        args, kwargs = self._sliced_inputs(c.inputs_sink, c.args_spec, c.kwargs_spec, batch, rows, leaves)
        weights = self._weights_of_the_call(params=True)
        rng_after = rng_states()
        try:
            set_rng_states(c.rng)
            with substituted(self.module, weights), torch.enable_grad(), autocast_regions(c.autocast):
                out = self.forward(self.module, list(args), dict(kwargs))
        except Exception as e:  # noqa: BLE001
            return f"running the module on the slice again failed ({type(e).__name__}: {str(e)[:200]})"
        finally:
            set_rng_states(rng_after)
        outs = [t for t in flatten(out) if isinstance(t, torch.Tensor)]
        pairs = [(o, g) for o, g in zip(outs, grad_output) if g is not None and o.requires_grad]
        positional = [leaves.get(id(a), a) for a in args if isinstance(a, torch.Tensor)]
        wanted = [a for a in positional if a.requires_grad]
        own = dict(self.module.named_parameters())  # first names only, as the gradient hooks see them
        params = {n: w for n, w in weights.items() if w.requires_grad and n in own}
        if not pairs:
            return "no output of the sliced run requires grad"
        if not wanted and not params:
            c.grad_output, c.grad_input, c.param_grads = grad_output, [None] * len(positional), {}
            return None
        grads = torch.autograd.grad([o for o, _ in pairs], wanted + list(params.values()),
                                    [g.to(o.device, o.dtype) for o, g in pairs], allow_unused=True)
        got_inputs, got_params = grads[:len(wanted)], grads[len(wanted):]
        sliced_inputs: list[torch.Tensor | None] = []
        it = iter(got_inputs)
        for a in positional:
            sliced_inputs.append(next(it) if a.requires_grad else None)
        for i, (got, real) in enumerate(zip(sliced_inputs, real_inputs)):
            if got is None or real is None:
                continue
            want = batch.first(real, rows) if batch is not None and batch.holds(real) else real
            d = diff(got.detach(), want, *tolerances(got.dtype))
            if not d.allclose:
                return (f"the gradient of input {i} on the first {rows} rows differs from those rows of the real one "
                        f"by up to {d.max_abs_error:.3g}: backward does not treat batch rows independently")
        c.grad_output = grad_output
        c.grad_input = [g.detach() if g is not None else None for g in sliced_inputs]
        c.param_grads = {n: g.detach() for n, g in zip(params, got_params) if g is not None}
        return None
