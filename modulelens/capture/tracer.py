"""The tracer: finds the target module call in a real run and snapshots it.

``nn.Module.__call__`` is wrapped while the tracer is installed. At each top-level call (a *root*
call, usually ``model(batch)``) the root's ``named_modules()`` give every module its qualified name,
so targets can be matched without touching the model code. At the selected matching call the
tracer snapshots, *before* the forward runs, the inputs (detached copies: forwards may mutate
them), the parameters and buffers, the RNG states, and train/grad mode; optionally exports a
``torch.export`` program; then runs the real forward, records the outputs and either ends the run
(:class:`CaptureComplete`) or, when backward is asked for, waits for the gradients to arrive.
"""

from __future__ import annotations

import fnmatch
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from modulelens.capture.values import SHAPE_ONLY_DEFAULT_BYTES, Encoder, TensorSink
from modulelens.errors import CaptureFailed
from modulelens.wrappers import WRAPPER_CLASSES as _WRAPPER_CLASSES

_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.")


class CaptureComplete(BaseException):
    """Raised out of the user's code once the capture is complete: ends the run early.
    A BaseException so that a user's ``except Exception`` does not swallow it."""


def strip_wrapper_prefix(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for p in _WRAPPER_PREFIXES:
            if name.startswith(p):
                name, changed = name[len(p):], True
            elif name == p[:-1]:
                name, changed = "", True
    return name


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
            return name == "" and type(module).__name__ not in _WRAPPER_CLASSES
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


@dataclass
class TraceOptions:
    target: str = ""
    call_index: int = 1
    backward: bool = False
    export: bool = True
    max_tensor_bytes: int = SHAPE_ONLY_DEFAULT_BYTES
    record: bool = True  # False on ranks that only follow along (distributed runs)
    stop: bool = True  # end the run once the capture is complete


_orig_call = nn.Module.__call__
_current: Tracer | None = None


def _traced_call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    tracer = _current
    if tracer is None or tracer.busy:
        return _orig_call(self, *args, **kwargs)
    return tracer.on_call(self, args, kwargs)


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
                self._discover(module)  # a new root: name everything below it
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
            return _orig_call(module, *args, **kwargs)
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
            training, grad_enabled = module.training, torch.is_grad_enabled()
            in_sink = TensorSink("", opts.max_tensor_bytes)
            enc = Encoder(in_sink, self.module_spec)
            args_spec = enc.encode(list(args), "args")
            kwargs_spec = enc.encode(dict(kwargs), "kwargs")
            weights = {n: t.detach().clone() for n, t in module.named_parameters()}
            weights.update({n: t.detach().clone() for n, t in module.named_buffers()})
            program, export_error, export_s = None, None, 0.0
            if opts.export:
                program, export_error, export_s = _try_export(module, args, kwargs)
                set_rng_states(rng)
        finally:
            self.busy = False
        captured = CapturedCall(
            module=module, module_path=name, call_index=self.matches, inputs_sink=in_sink,
            args_spec=args_spec, kwargs_spec=kwargs_spec, outputs_sink=TensorSink("", opts.max_tensor_bytes),
            outputs_spec=None, weights=weights, rng=rng, training=training, grad_enabled=grad_enabled,
            unrecorded=list(enc.unrecorded), forward_seconds=0.0, program=program,
            export_error=export_error, export_seconds=export_s,
        )
        if opts.backward:
            self._install_backward_hooks(module, captured)
        t0 = time.perf_counter()
        out = self._forward(module, args, kwargs)
        captured.forward_seconds = time.perf_counter() - t0
        out_enc = Encoder(captured.outputs_sink, self.module_spec)
        captured.outputs_spec = out_enc.encode(out, "output")
        captured.unrecorded += out_enc.unrecorded
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

    def _forward(self, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        self.depth += 1
        try:
            return _orig_call(module, *args, **kwargs)
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
                "lower --call, or run more steps",
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


def _try_export(module: nn.Module, args: tuple, kwargs: dict) -> tuple[Any, str | None, float]:
    t0 = time.perf_counter()
    try:
        program = torch.export.export(module, tuple(args), dict(kwargs), strict=False)
        return program, None, time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - any export failure is reported, never fatal
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return None, f"{type(e).__name__}: {first[:300]}", time.perf_counter() - t0
