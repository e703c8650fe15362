"""The tracer: finds the target module call in a real run and snapshots it.

``nn.Module.__call__`` is wrapped while the tracer is installed. At each top-level call (a *root*
call, usually ``model(batch)``) the modules below the model that built the root (or the root
itself) get their qualified names, without the names wrappers add (DDP, torch.compile, FSDP), so
targets can be matched without touching the model code; compiled modules run eagerly until the
capture. At the selected matching call the tracer snapshots, *before* the forward runs, the inputs
(detached copies: forwards may mutate them), the constructor arguments as they are now, the
parameters and buffers, the RNG states, train/grad mode and autocast regions; then runs the real
forward and records the outputs and the state the forward changed (inputs, buffers), within the
capture's byte budget (:mod:`modulelens.capture.budget`, :mod:`modulelens.capture.slicing`);
optionally exports the call's
:class:`~modulelens.capture.leafcall.LeafCall`; and either ends the run (:class:`CaptureComplete`)
or, when backward is asked for, waits for the gradients to arrive.
"""

from __future__ import annotations

import fnmatch
import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from modulelens.capture import init_args
from modulelens.capture.budget import (
    DEFAULT_CAPTURE_BYTES,
    WeightSnapshot,
    batch_candidates,
    snapshot_weights,
    tensors_bytes,
)
from modulelens.capture.call import (  # noqa: F401 - rng and autocast helpers are imported from here too
    CapturedCall,
    autocast_regions,
    autocast_state,
    call_input,
    load_buffers,
    rng_states,
    set_rng_states,
)
from modulelens.capture.custom_ops import op_modules
from modulelens.capture.leafcall import BUFFER_PREFIX, call_state, changed_state, export_leaf_call
from modulelens.capture.manifest import ActivationStorage
from modulelens.capture.sharded import gathered, read_inside_call, substituted
from modulelens.capture.slicing import RowSlicer, preslice
from modulelens.capture.spec_walk import tensor_leaves
from modulelens.capture.unrecorded import describe, watch_points, watching_reads
from modulelens.capture.values import Encoder, TensorSink, Unrecorded, keyed_tensors, tensors_in
from modulelens.errors import CaptureFailed
from modulelens.wrappers import WRAPPER_CLASSES, strip_wrapper_prefix


class CaptureComplete(BaseException):
    """Raised out of the user's code once the capture is complete: ends the run early.
    A BaseException so that a user's ``except Exception`` does not swallow it."""


@dataclass(frozen=True)
class Target:
    """What to capture: ``encoder.layers.3.attn``, a glob ``layers.*.mlp``, ``type:ClassName``, or
    the root model (empty string)."""

    text: str

    @property
    def kind(self) -> str:
        if not self.text:
            return "root"
        if self.text.startswith("type:"):
            return "type"
        if any(c in self.text for c in "*?["):
            return "glob"
        return "name"

    def matches(self, name: str, module: nn.Module) -> bool:
        kind = self.kind
        if kind == "root":
            return name == "" and type(module).__name__ not in WRAPPER_CLASSES
        if kind == "type":
            want = self.text[5:]
            cls = type(module)
            return want in (cls.__name__, cls.__qualname__, f"{cls.__module__}.{cls.__qualname__}")
        if kind == "glob":
            parts, pats = name.split("."), self.text.split(".")
            return len(parts) == len(pats) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts, pats))
        return name == self.text



@dataclass
class TraceOptions:
    target: str = ""
    call_index: int = 1
    backward: bool = False
    export: bool = True
    max_tensor_bytes: int | None = None  # per tensor; None: no limit
    max_capture_bytes: int = DEFAULT_CAPTURE_BYTES  # weights, inputs and outputs together
    record: bool = True  # False on ranks that only follow along (distributed runs)
    stop: bool = True  # end the run once the capture is complete


_orig_call = nn.Module.__call__
_current: Tracer | None = None


def _traced_call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    tracer = _current
    if tracer is None or tracer.busy:
        return _orig_call(self, *args, **kwargs)
    compiled = getattr(self, "_orig_mod", None)
    if tracer.state == "waiting" and isinstance(compiled, nn.Module) and type(self).__name__ == "OptimizedModule":
        return _traced_call(compiled, *args, **kwargs)  # torch.compile: run the module eagerly until captured
    return tracer.on_call(self, args, kwargs)


def _eager_call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Call a module without its compiled form (``module.compile()``), so that the modules inside
    it are called one by one and the target can be found."""
    if getattr(module, "_compiled_call_impl", None) is not None:
        return module._call_impl(*args, **kwargs)
    return _orig_call(module, *args, **kwargs)


class Tracer:
    def __init__(self, options: TraceOptions, module_spec=None):
        if options.call_index < 1:
            raise CaptureFailed(f"call index must be 1 or more, got {options.call_index}", "use 1 for the first call")
        self.options = options
        self.target = Target(options.target)
        self.module_spec = module_spec  # encodes nested modules appearing in inputs
        self.busy = False
        self.depth = 0
        self.state = "waiting"  # waiting -> backward_pending -> done
        self.matches = 0
        self.names: dict[int, tuple[weakref.ref, str]] = {}
        self.seen_names: list[str] = []
        self.seen_types: set[str] = set()
        self.captured: CapturedCall | None = None
        self._root: nn.Module | None = None
        self._hooks: list[Any] = []
        self._backward_seen = False

    # -- installation -------------------------------------------------------------------------
    def install(self) -> Tracer:
        global _current
        if _current is not None:
            raise CaptureFailed("another capture is already running in this process", "finish it first")
        _current = self
        nn.Module.__call__ = _traced_call  # type: ignore[method-assign]
        return self

    def uninstall(self) -> None:
        global _current
        if _current is self:
            nn.Module.__call__ = _orig_call  # type: ignore[method-assign]
            _current = None
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def __enter__(self) -> Tracer:
        return self.install()

    def __exit__(self, *exc: Any) -> bool:
        self.uninstall()
        return False

    # -- names --------------------------------------------------------------------------------
    def _discover(self, root: nn.Module) -> None:
        for name, m in root.named_modules():
            name = strip_wrapper_prefix(name)
            self.names[id(m)] = (weakref.ref(m), name)
        self.seen_names = sorted({n for _, n in self.names.values()})

    def _name(self, module: nn.Module) -> str | None:
        entry = self.names.get(id(module))
        if entry is not None and entry[0]() is module:
            return entry[1]
        return None

    # -- the hook -----------------------------------------------------------------------------
    def on_call(self, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        if self.depth == 0:
            if self.state == "backward_pending" and self._backward_seen:
                self._finish_backward()
                if self.options.stop:
                    raise CaptureComplete()
            if self.state == "done":
                return _orig_call(module, *args, **kwargs)
            if self._name(module) is None:
                # a new root: name everything below the model that built it (a layer called alone,
                # as activation checkpointing does, keeps its name in the model), else below it
                owner = init_args.built_within(module)
                self._discover(module if owner is None else owner)
            if self._name(module) == "":
                self._root = module
        name = self._name(module)
        if name is None and self._root is not None:
            self._discover(self._root)  # a module added after the last look
            name = self._name(module)
        self.seen_types.add(type(module).__name__)
        if self.state == "waiting" and name is not None and self.target.matches(name, module):
            self.matches += 1
            if self.matches == self.options.call_index:
                return self._capture(module, name, args, kwargs)
        elif self.state == "backward_pending" and self.captured is not None and module is self.captured.module:
            self.captured.calls_after_capture += 1
        self.depth += 1
        try:
            return (_eager_call if self.state == "waiting" else _orig_call)(module, *args, **kwargs)
        finally:
            self.depth -= 1

    def _capture(self, module: nn.Module, name: str, args: tuple, kwargs: dict) -> Any:
        opts = self.options
        if not opts.record:
            out = self._forward(module, args, kwargs)
            self.state = "done"
            if opts.stop and not opts.backward:
                raise CaptureComplete()
            self.state = "backward_pending" if opts.backward else "done"
            self._backward_seen = True
            return out
        self.busy = True
        try:
            rng = rng_states()
            training, grad_enabled, autocast = module.training, torch.is_grad_enabled(), autocast_state()
            weights = snapshot_weights(module, opts.max_capture_bytes, opts.max_tensor_bytes)
            budget = max(0, opts.max_capture_bytes - weights.stored_bytes)  # what the weights leave
            _, given = keyed_tensors([list(args), dict(kwargs)], "")
            inputs = list(given.values())
            in_bytes = tensors_bytes(inputs)
            candidates = batch_candidates(inputs)
            presliced = (preslice(args, kwargs, candidates, in_bytes, budget, opts.max_tensor_bytes, self.module_spec)
                         if in_bytes > budget and candidates else {})
            if presliced:  # the inputs alone are over the budget: snapshot their first rows only
                first = next(iter(presliced.values()))
                in_sink, args_spec, kwargs_spec, found = first.sink, first.args_spec, first.kwargs_spec, first.found
            else:
                in_sink = TensorSink("", opts.max_tensor_bytes)
                enc = Encoder(in_sink, self.module_spec)
                args_spec, kwargs_spec = enc.encode(list(args), "args"), enc.encode(dict(kwargs), "kwargs")
                found = enc.found
            init_sink = TensorSink("init.")
            init_enc = Encoder(init_sink)
            init_enc.module_spec = lambda m, p: init_args.construction_spec(m, p, init_enc)
            init_spec = init_args.construction_spec(module, "init", init_enc)
            attributes = init_args.plain_attributes(module)
        finally:
            self.busy = False
        captured = CapturedCall(
            module=module, module_path=name, call_index=self.matches, inputs_sink=in_sink,
            args_spec=args_spec, kwargs_spec=kwargs_spec, outputs_sink=TensorSink("", opts.max_tensor_bytes),
            outputs_spec=None, weights=weights.sink.tensors, weight_specs=weights.sink.specs, rng=rng,
            training=training, grad_enabled=grad_enabled, unrecorded=describe(found, None, set()),
            forward_seconds=0.0, init_spec=init_spec, init_sink=init_sink, attributes=attributes,
            state_sink=TensorSink("", opts.max_tensor_bytes), autocast=autocast, weights_storage=weights.storage,
        )
        self._read_sharded_inside_call(module, weights, captured)
        if opts.backward:
            self._install_backward_hooks(module, captured)
        t0 = time.perf_counter()
        try:
            out = self._watched_forward(module, args, kwargs, init_enc.found, captured)
        except RuntimeError as e:
            if not (opts.backward and _HOOKED_INPUT_CHANGED in str(e)):
                raise
            out = self._forward_without_module_hook(module, args, kwargs, init_enc.found, captured)
        captured.forward_seconds = time.perf_counter() - t0
        _, out_tensors = keyed_tensors(out, "output")
        total = in_bytes + tensors_bytes(list(out_tensors.values()))
        self.busy = True
        # Work on the side (a run on the first rows, export) must not count as the call's own:
        # activation checkpointing counts the tensors a forward saves for backward.
        side = torch.autograd.graph.saved_tensors_hooks(_same, _same)
        try:
            side.__enter__()
            if presliced or total > budget:
                self._slicer(module, captured).store(args, kwargs, out, inputs, total, budget, presliced)
            else:
                captured.activations = ActivationStorage(mode="full", budget_bytes=budget, total_bytes=total,
                                                         reason="within the budget")
                self._store_outputs(out, captured, captured.outputs_sink)
                self._record_state_after(module, args, kwargs, captured)
            if opts.export:
                self._export(module, captured)
        finally:
            side.__exit__(None, None, None)
            self.busy = False
        self.captured = captured
        if opts.backward:
            if not any(t.requires_grad for t in tensors_in(out)):
                captured.backward_notes.append(
                    "no output requires grad (eval/no_grad at the call): backward was not captured"
                )
                self.state = "done"
            else:
                self.state = "backward_pending"
                return out
        self.state = "done"
        if opts.stop:
            raise CaptureComplete()
        return out

    def _read_sharded_inside_call(self, module: nn.Module, weights: WeightSnapshot, captured: CapturedCall) -> None:
        """Sharded parameters are read when the forward starts, after FSDP gathered them (see
        :mod:`modulelens.capture.sharded`); ones still sharded then keep their local shard, noted."""
        if not weights.inside_call:
            return

        def read(name: str, t: torch.Tensor) -> None:
            if type(t).__name__ == "DTensor" and t.device_mesh.size() > 1:
                captured.notes.append(f"parameter {name} stays sharded during the call (tensor parallelism?): its "
                                      "local shard is stored, and replay on one process will not match")
                t = t.to_local()
            weights.sink.add(name, t.detach())

        read_inside_call(module, weights.inside_call, read)

    def _slicer(self, module: nn.Module, captured: CapturedCall) -> RowSlicer:
        return RowSlicer(module, captured, self._forward, self._store_outputs, self.options.max_tensor_bytes,
                         self.module_spec)

    def _watched_forward(self, module: nn.Module, args: tuple, kwargs: dict, init_found: list[Unrecorded],
                         captured: CapturedCall) -> Any:
        """The real forward, watching reads of the constructor values that were not recorded (see
        :mod:`modulelens.capture.unrecorded`); notes what each of them blocks."""
        points = watch_points(module, init_found) if init_found else []
        with watching_reads([(obj, name) for obj, name, _ in points]) as seen:
            out = self._forward(module, args, kwargs)
        read = {i for obj, name, i in points if (id(obj), name) in seen}
        captured.unrecorded += describe(init_found, read, {i for _, _, i in points})
        return out

    def _store_outputs(self, out: Any, captured: CapturedCall, sink: TensorSink) -> None:
        out_enc = Encoder(sink, self.module_spec)
        captured.outputs_sink = sink
        captured.outputs_spec = out_enc.encode(out, "output")
        captured.unrecorded += describe(out_enc.found, None, set())

    def _record_state_after(self, module: nn.Module, args: tuple, kwargs: dict, captured: CapturedCall) -> None:
        """Keep the input tensors and buffers the forward changed (in place or by replacing them,
        as caches do), as they are after it. Tensors kept shape-only are not compared."""
        before = dict(captured.inputs_sink.tensors)
        before.update({BUFFER_PREFIX + n: t for n, t in captured.weights.items()})
        skip = set(captured.inputs_sink.shape_only) | {BUFFER_PREFIX + n for n in captured.weights_shape_only}
        after = {k: t for k, t in call_state(module, args, kwargs).items() if k not in skip}
        for key, t in changed_state(before, after).items():
            captured.state_sink.add(key, t)

    def _export(self, module: nn.Module, captured: CapturedCall) -> None:
        """Export the call's LeafCall on the snapshotted inputs, now that the keys it returns are
        known; the run's RNG state is left as the forward left it. A sharded module is exported on
        the whole parameter values read during its call, with FSDP's hooks set aside."""
        rng = rng_states()
        t0 = time.perf_counter()
        specs = tensor_leaves(captured.args_spec) + tensor_leaves(captured.kwargs_spec)
        leaves = {s.key: call_input(s, captured.inputs_sink.tensors.get(s.key), as_in_run=False) for s in specs}
        returned = [s.key for s in tensor_leaves(captured.outputs_spec)]
        returned += [k for k in captured.state_sink.specs if not k.startswith(BUFFER_PREFIX)]
        try:
            with torch.set_grad_enabled(captured.grad_enabled), substituted(module, gathered(module, captured.weights)):
                captured.program = export_leaf_call(module, captured.args_spec, captured.kwargs_spec, leaves, returned)
            captured.returned_keys = returned
            captured.custom_ops = op_modules(captured.program, type(module).__module__)
        except Exception as e:  # noqa: BLE001 - any export failure is reported, never fatal
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            captured.export_error = f"{type(e).__name__}: {first[:300]}"
        captured.export_seconds = time.perf_counter() - t0
        set_rng_states(rng)

    def _forward(self, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        self.depth += 1
        try:
            return _eager_call(module, *args, **kwargs)
        finally:
            self.depth -= 1

    def _install_backward_hooks(self, module: nn.Module, captured: CapturedCall) -> None:
        def on_module_backward(_m, grad_input, grad_output):
            captured.grad_input = [g.detach().clone() if g is not None else None for g in grad_input]
            captured.grad_output = [g.detach().clone() if g is not None else None for g in grad_output]
            self._backward_seen = True

        self._hooks.append(module.register_full_backward_hook(on_module_backward))
        for pname, p in module.named_parameters():
            if p.requires_grad:
                def on_param(g, pname=pname):
                    captured.param_grads[pname] = g.detach().clone()
                self._hooks.append(p.register_hook(on_param))

    def _forward_without_module_hook(self, module: nn.Module, args: tuple, kwargs: dict,
                                     init_found: list[Unrecorded], captured: CapturedCall) -> Any:
        """The module changes an input in place, which its full backward hook forbids (the hook
        hands it views of its inputs): the call runs again without the hook, from the RNG and buffer
        state it started with (the refused operation changed nothing). The gradient reaching the
        outputs is read from the output tensors; input and parameter gradients are computed at the
        end by running the module again on the captured inputs (:mod:`modulelens.capture.slicing`)."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        set_rng_states(captured.rng)
        load_buffers(module, captured.weights)
        captured.gradients_by_rerun = True
        out = self._watched_forward(module, args, kwargs, init_found, captured)
        outputs = tensors_in(out)

        def on_output(g: torch.Tensor, i: int) -> None:
            if captured.grad_output is None:
                captured.grad_output = [None] * len(outputs)
            captured.grad_output[i] = g.detach().clone()
            self._backward_seen = True

        for i, t in enumerate(outputs):
            if t.requires_grad:
                self._hooks.append(t.register_hook(lambda g, i=i: on_output(g, i)))
        return out

    def _finish_backward(self) -> None:
        c = self.captured
        assert c is not None
        if c.gradients_by_rerun:
            self.busy = True
            try:
                self._slicer(c.module, c).rerun_gradients()
            finally:
                self.busy = False
        elif c.activations is not None and c.activations.mode == "batch_slice":
            self.busy = True
            try:  # the gradients of the stored rows (parameter gradients recomputed on the slice)
                self._slicer(c.module, c).slice_gradients()
            finally:
                self.busy = False
        elif c.calls_after_capture:
            c.backward_notes.append(
                f"the module ran {c.calls_after_capture} more time(s) before backward: parameter "
                "gradients include those calls and are not compared"
            )
            c.param_grads = {}
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self.state = "done"

    def finish(self) -> CapturedCall | None:
        """Call when the run ended (normally or through CaptureComplete)."""
        if self.state == "backward_pending":
            if self._backward_seen:
                self._finish_backward()
            elif self.captured is not None:
                self.captured.backward_notes.append("the run ended before a gradient reached the module's outputs")
                self.state = "done"
        self.uninstall()
        return self.captured

    def no_match_error(self) -> CaptureFailed:
        import difflib

        if self.matches and self.matches < self.options.call_index:
            return CaptureFailed(
                f"{self.target.text!r} was called {self.matches} time(s), fewer than the call index {self.options.call_index}",
                "lower [--call], or run more steps",
            )
        if not self.seen_names:
            return CaptureFailed(
                "the run called no nn.Module at all", "check that the script runs a model forward"
            )
        if self.target.kind == "type":
            close = difflib.get_close_matches(self.target.text[5:], sorted(self.seen_types), n=5)
            hint = f"did you mean type:{', type:'.join(close)}?" if close else f"types seen: {', '.join(sorted(self.seen_types)[:30])}"
        else:
            close = difflib.get_close_matches(self.target.text, self.seen_names, n=5, cutoff=0.5)
            sample = [n for n in self.seen_names if n and n.count(".") <= 1][:30]
            hint = (f"did you mean {', '.join(close)}?" if close else "") + f" module names seen: {', '.join(sample)}"
        return CaptureFailed(f"no module matching {self.target.text!r} was called", hint.strip())


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


_HOOKED_INPUT_CHANGED = "of BackwardHookFunction is a view and is being modified inplace"
"""What autograd says when a module changes in place an input its full backward hook wrapped."""
