"""The tracer: finds the target module call in a real run and snapshots it.

``nn.Module.__call__`` is wrapped while the tracer is installed. At each top-level call (a *root*
call, usually ``model(batch)``) the modules below the model that built the root (or the root
itself) get their qualified names, without the names wrappers add (DDP, torch.compile, FSDP), so
targets can be matched without touching the model code; compiled modules run eagerly until the
capture. At the selected matching call the tracer snapshots, *before* the forward runs, the inputs
(detached copies: forwards may mutate them), the constructor arguments as they are now, the
parameters and buffers, the RNG states, train/grad mode and autocast regions; then runs the real
forward and records the outputs and the state the forward changed (inputs, buffers), within the
capture's byte budget (:mod:`modulelens.capture.budget`); optionally exports the call's
:class:`~modulelens.capture.leafcall.LeafCall`; and either ends the run (:class:`CaptureComplete`)
or, when backward is asked for, waits for the gradients to arrive.
"""

from __future__ import annotations

import contextlib
import fnmatch
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from modulelens.capture import init_args
from modulelens.capture.budget import (
    DEFAULT_CAPTURE_BYTES,
    SliceSink,
    batch_size,
    first_rows,
    is_batched,
    rows_within,
    tensors_bytes,
)
from modulelens.capture.leafcall import BUFFER_PREFIX, LeafSource, call_state, changed_state, export_leaf_call
from modulelens.capture.manifest import ActivationStorage
from modulelens.capture.sources import Resolver
from modulelens.capture.spec import ModuleSpec, TensorSpec, tensor_leaves
from modulelens.capture.values import Decoder, Encoder, TensorSink, keyed_tensors, parse_dtype
from modulelens.errors import CaptureFailed
from modulelens.numerics import diff, tolerances
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


def rng_states() -> dict[str, torch.Tensor]:
    states = {"cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            states[f"cuda.{i}"] = s
    return states


def set_rng_states(states: dict[str, torch.Tensor]) -> None:
    torch.random.set_rng_state(states["cpu"])
    cuda = [states[k] for k in sorted(states) if k.startswith("cuda.")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])


_AUTOCAST_DEVICES = ("cpu", "cuda")


def autocast_state() -> dict[str, str]:
    """The ``torch.autocast`` regions active now: device type -> dtype name."""
    active = {}
    for device in _AUTOCAST_DEVICES:
        if torch.is_autocast_enabled(device):
            active[device] = str(torch.get_autocast_dtype(device)).removeprefix("torch.")
    return active


def autocast_regions(state: dict[str, str]) -> contextlib.ExitStack:
    """Enter the recorded autocast regions again (a context manager)."""
    stack = contextlib.ExitStack()
    for device, dtype in state.items():
        stack.enter_context(torch.autocast(device, dtype=parse_dtype(dtype)))
    return stack


@dataclass
class CapturedCall:
    module: nn.Module
    module_path: str
    call_index: int
    inputs_sink: TensorSink
    args_spec: Any
    kwargs_spec: Any
    outputs_sink: TensorSink
    outputs_spec: Any
    weights: dict[str, torch.Tensor]
    rng: dict[str, torch.Tensor]
    training: bool
    grad_enabled: bool
    unrecorded: list[str]
    forward_seconds: float
    program: Any = None
    export_error: str | None = None
    export_seconds: float = 0.0
    grad_output: list[torch.Tensor | None] | None = None
    grad_input: list[torch.Tensor | None] | None = None
    param_grads: dict[str, torch.Tensor] = field(default_factory=dict)
    backward_notes: list[str] = field(default_factory=list)
    calls_after_capture: int = 0
    init_spec: ModuleSpec | None = None
    init_sink: TensorSink = field(default_factory=lambda: TensorSink("init."))
    init_unrecorded: list[str] = field(default_factory=list)
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)
    state_sink: TensorSink = field(default_factory=TensorSink)  # inputs and buffers the forward changed
    returned_keys: list[str] = field(default_factory=list)  # what the exported LeafCall returns
    activations: ActivationStorage | None = None
    autocast: dict[str, str] = field(default_factory=dict)  # device type -> dtype of enabled autocast


@dataclass
class TraceOptions:
    target: str = ""
    call_index: int = 1
    backward: bool = False
    export: bool = True
    max_tensor_bytes: int | None = None  # per tensor; None: no limit
    max_capture_bytes: int = DEFAULT_CAPTURE_BYTES  # inputs and outputs together
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
            _, given = keyed_tensors([list(args), dict(kwargs)], "")
            in_bytes, batch = tensors_bytes(list(given.values())), batch_size(list(given.values()))
            presliced = batch is not None and batch > 1 and in_bytes > opts.max_capture_bytes
            if presliced:  # the inputs alone are over the budget: snapshot their first rows only
                assert batch is not None
                rows = rows_within(batch, 2 * in_bytes, opts.max_capture_bytes)
                in_sink: TensorSink = SliceSink(rows, batch, opts.max_tensor_bytes)
            else:
                in_sink = TensorSink("", opts.max_tensor_bytes)
            enc = Encoder(in_sink, self.module_spec)
            args_spec = enc.encode(list(args), "args")
            kwargs_spec = enc.encode(dict(kwargs), "kwargs")
            init_sink = TensorSink("init.")
            init_enc = Encoder(init_sink)
            init_enc.module_spec = lambda m, p: init_args.construction_spec(m, p, init_enc)
            init_spec = init_args.construction_spec(module, "init", init_enc)
            attributes = init_args.plain_attributes(module)
            weights = {n: _plain(t) for n, t in module.named_parameters()}
            weights.update({n: _plain(t) for n, t in module.named_buffers()})
        finally:
            self.busy = False
        captured = CapturedCall(
            module=module, module_path=name, call_index=self.matches, inputs_sink=in_sink,
            args_spec=args_spec, kwargs_spec=kwargs_spec, outputs_sink=TensorSink("", opts.max_tensor_bytes),
            outputs_spec=None, weights=weights, rng=rng, training=training, grad_enabled=grad_enabled,
            unrecorded=list(enc.unrecorded), forward_seconds=0.0, init_spec=init_spec, init_sink=init_sink,
            init_unrecorded=list(init_enc.unrecorded), attributes=attributes,
            state_sink=TensorSink("", opts.max_tensor_bytes), autocast=autocast,
        )
        if opts.backward:
            self._install_backward_hooks(module, captured)
        t0 = time.perf_counter()
        out = self._forward(module, args, kwargs)
        captured.forward_seconds = time.perf_counter() - t0
        _, out_tensors = keyed_tensors(out, "output")
        total = in_bytes + tensors_bytes(list(out_tensors.values()))
        self.busy = True
        # Work on the side (a run on the first rows, export) must not count as the call's own:
        # activation checkpointing counts the tensors a forward saves for backward.
        side = torch.autograd.graph.saved_tensors_hooks(_same, _same)
        try:
            side.__enter__()
            if presliced or total > opts.max_capture_bytes:
                self._store_within_budget(module, args, kwargs, out, out_tensors, captured, batch, total)
            else:
                captured.activations = ActivationStorage(mode="full", budget_bytes=opts.max_capture_bytes,
                                                         total_bytes=total, reason="within the budget")
                self._store_outputs(out, captured, captured.outputs_sink)
                self._record_state_after(module, args, kwargs, captured)
            if opts.export:
                self._export(module, captured)
        finally:
            side.__exit__(None, None, None)
            self.busy = False
        self.captured = captured
        if opts.backward:
            if not any(t.requires_grad for t in _tensors(out)):
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

    def _store_outputs(self, out: Any, captured: CapturedCall, sink: TensorSink) -> None:
        out_enc = Encoder(sink, self.module_spec)
        captured.outputs_sink = sink
        captured.outputs_spec = out_enc.encode(out, "output")
        captured.unrecorded += out_enc.unrecorded

    def _store_within_budget(self, module: nn.Module, args: tuple, kwargs: dict, out: Any,
                             out_tensors: dict[str, torch.Tensor], captured: CapturedCall, batch: int | None,
                             total: int) -> None:
        """The call's activations are over the budget: keep the first batch rows when the module
        treats rows independently, else store shape-only with statistics. Says which and why.

        Inputs whose first rows only were snapshotted get their statistics from the live tensors,
        after the call (an input the forward changed in place is described as it changed)."""
        budget = self.options.max_capture_bytes
        over = f"the activations total {total / 2**20:.1f} MiB, over the budget of {budget / 2**20:.1f} MiB"
        why, worst = None, None
        if batch is None or batch < 2:
            why = "the inputs have no batch dimension of 2 or more rows to slice"
        elif not out_tensors or not all(is_batched(t, batch) for t in out_tensors.values()):
            why = f"not every output tensor has the batch dimension ({batch} rows) first"
        elif captured.inputs_sink.shape_only:
            why = "some inputs are over the per-tensor limit and were not snapshotted"
        if why is None:
            assert batch is not None
            rows = rows_within(batch, total, budget)
            why, worst = self._capture_rows(module, out_tensors, captured, batch, rows)
            if why is None:
                captured.activations = ActivationStorage(
                    mode="batch_slice", budget_bytes=budget, total_bytes=total, rows=rows, batch_rows=batch,
                    check_max_abs_error=worst, reason=f"{over}; the module treats batch rows independently (its output on the first {rows} "
                    f"rows matched those rows of the real output), so the first {rows} of {batch} rows are stored "
                    "and replay is exact on them")
                return
        if isinstance(captured.inputs_sink, SliceSink):
            captured.args_spec, captured.kwargs_spec, captured.inputs_sink = _stats_specs(args, kwargs)
        self._store_outputs(out, captured, TensorSink("", 0))
        captured.activations = ActivationStorage(
            mode="shape_only", budget_bytes=budget, total_bytes=total, batch_rows=batch,
            check_max_abs_error=worst, reason=f"{over}; {why}: tensors are stored shape-only with statistics and replay cannot compare outputs")

    def _capture_rows(self, module: nn.Module, out_tensors: dict[str, torch.Tensor], captured: CapturedCall,
                      batch: int, rows: int) -> tuple[str | None, float]:
        """Run the module on the first ``rows`` rows of the snapshotted inputs, from the RNG and buffer
        state the real call started with; when that output matches the same rows of the real output,
        store the sliced run as the capture (inputs, outputs, changed state). Returns why not (None
        when stored) and the largest difference found. The module's buffers and the RNG are left as
        the real call left them."""
        sink = captured.inputs_sink
        batched = sink.sliced if isinstance(sink, SliceSink) else {k for k, t in sink.tensors.items() if is_batched(t, batch)}
        specs = {s.key: s for s in tensor_leaves(captured.args_spec) + tensor_leaves(captured.kwargs_spec)}
        leaves = {k: _snapshot(specs[k], t) for k, t in first_rows(sink.tensors, batched, rows).items()}
        decoder = Decoder(LeafSource(leaves), Resolver())
        args, kwargs = decoder.decode(captured.args_spec), decoder.decode(captured.kwargs_spec)
        in_sink = TensorSink("", self.options.max_tensor_bytes)
        enc = Encoder(in_sink, self.module_spec)
        args_spec, kwargs_spec = enc.encode(list(args), "args"), enc.encode(dict(kwargs), "kwargs")
        after_real = {n: b.detach().clone() for n, b in module.named_buffers()}
        rng_after = rng_states()
        try:
            _load_buffers(module, captured.weights)
            set_rng_states(captured.rng)
            with torch.set_grad_enabled(captured.grad_enabled):
                sliced_out = self._forward(module, list(args), dict(kwargs))
            _, sliced = keyed_tensors(sliced_out, "output")
            worst, ok = 0.0, sliced.keys() == out_tensors.keys()
            for key, t in sliced.items() if ok else ():
                real = out_tensors[key][:rows]
                d = diff(t, real, *tolerances(t.dtype))
                worst, ok = max(worst, d.max_abs_error), ok and d.allclose
            if not ok:
                return (f"the module does not treat batch rows independently (on the first {rows} rows its output "
                        f"differs from those rows of the real output by up to {worst:.3g}; BatchNorm in training "
                        "mode and other batch statistics do this)"), worst
            captured.inputs_sink, captured.args_spec, captured.kwargs_spec = in_sink, args_spec, kwargs_spec
            self._store_outputs(sliced_out, captured, TensorSink("", self.options.max_tensor_bytes))
            before = dict(in_sink.tensors)
            before.update({BUFFER_PREFIX + n: t for n, t in captured.weights.items()})
            for key, t in changed_state(before, call_state(module, args, kwargs)).items():
                captured.state_sink.add(key, t)
            return None, worst
        finally:
            _load_buffers(module, after_real)
            set_rng_states(rng_after)

    def _record_state_after(self, module: nn.Module, args: tuple, kwargs: dict, captured: CapturedCall) -> None:
        """Keep the input tensors and buffers the forward changed (in place or by replacing them,
        as caches do), as they are after it."""
        before = dict(captured.inputs_sink.tensors)
        before.update({BUFFER_PREFIX + n: t for n, t in captured.weights.items()})
        after = {k: t for k, t in call_state(module, args, kwargs).items()
                 if k not in captured.inputs_sink.shape_only}
        for key, t in changed_state(before, after).items():
            captured.state_sink.add(key, t)

    def _export(self, module: nn.Module, captured: CapturedCall) -> None:
        """Export the call's LeafCall on the snapshotted inputs, now that the keys it returns are
        known; the run's RNG state is left as the forward left it."""
        rng = rng_states()
        t0 = time.perf_counter()
        specs = tensor_leaves(captured.args_spec) + tensor_leaves(captured.kwargs_spec)
        leaves = {s.key: _snapshot(s, captured.inputs_sink.tensors.get(s.key)) for s in specs}
        returned = [s.key for s in tensor_leaves(captured.outputs_spec)]
        returned += [k for k in captured.state_sink.specs if not k.startswith(BUFFER_PREFIX)]
        try:
            with torch.set_grad_enabled(captured.grad_enabled):
                captured.program = export_leaf_call(module, captured.args_spec, captured.kwargs_spec, leaves, returned)
            captured.returned_keys = returned
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

    def _finish_backward(self) -> None:
        c = self.captured
        assert c is not None
        if c.calls_after_capture:
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


def _tensors(value: Any) -> list[torch.Tensor]:
    from modulelens.capture.values import flatten

    return [x for x in flatten(value) if isinstance(x, torch.Tensor)]


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A detached copy of a parameter or buffer as a plain tensor: a DTensor (FSDP2's ``fully_shard``,
    tensor parallelism) gives its whole value when its mesh has one rank, else its local shard."""
    t = t.detach()
    if type(t).__name__ == "DTensor":
        t = t.full_tensor() if t.device_mesh.size() == 1 else t.to_local()
    return t.clone()


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _stats_specs(args: tuple, kwargs: dict) -> tuple[Any, Any, TensorSink]:
    """The inputs encoded shape-only with statistics (full shapes): kept for the case the module
    turns out not to treat batch rows independently."""
    sink = TensorSink("", 0)
    enc = Encoder(sink)
    return enc.encode(list(args), "args"), enc.encode(dict(kwargs), "kwargs"), sink


def _load_buffers(module: nn.Module, values: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, b in module.named_buffers():
            if name in values:
                b.copy_(values[name])


def _snapshot(spec: TensorSpec, stored: torch.Tensor | None) -> torch.Tensor:
    """An input tensor to call the module with: a copy of its snapshot, or an uninitialised tensor
    of its shape when it was kept shape-only (export needs shapes and dtypes, not values)."""
    dtype = parse_dtype(spec.dtype)
    t = stored.to(spec.device, copy=True) if stored is not None else torch.empty(spec.shape, dtype=dtype, device=spec.device)
    return t.requires_grad_(True) if spec.requires_grad and t.is_floating_point() else t
