"""Rebuild a captured module and its inputs from a capture artifact.

Strategies: ``source`` (import the class, construct it from the recorded arguments, load the
captured weights), ``export`` (load the saved ``torch.export`` program: no source code needed) and
``pickle`` (unpickle the saved module; runs arbitrary code, so only with an explicit trust flag).
"""

from __future__ import annotations

import functools
import io
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from safetensors import safe_open

from modulelens.capture import init_args
from modulelens.capture.artifact import load_tensors
from modulelens.capture.custom_ops import import_op_modules, missing_op_error, missing_ops
from modulelens.capture.leafcall import BUFFER_PREFIX, LEAF_PROGRAM_PREFIX, LeafProgramCall
from modulelens.capture.manifest import CaptureManifest, capture_manifest
from modulelens.capture.sources import Resolver
from modulelens.capture.spec import ModuleSpec, TensorSpec
from modulelens.capture.values import Decoder, TensorSource, keyed_values
from modulelens.errors import ModuleLensError, ReplayFailed
from modulelens.repo import Artifact, require_trusted

STRATEGIES = ("source", "export", "pickle")


class _NoTensors(TensorSource):
    """Tensors read as None: for rebuilding a value's other parts only."""

    def get(self, spec: TensorSpec) -> None:
        return None
T = TypeVar("T")


def _materialized(module: torch.nn.Module, device: str | None) -> torch.nn.Module:
    """``module`` with storage for its parameters and buffers on the ``meta`` device (models built
    on meta and materialised later record ``device="meta"``; programs are saved without their
    weights); the captured weights fill them. Tensors that have data keep it."""
    target = torch.device(device or "cpu")
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None and p.is_meta:
                sub._parameters[name] = torch.nn.Parameter(torch.empty_like(p, device=target), p.requires_grad)
        for name, b in list(sub._buffers.items()):
            if b is not None and b.is_meta:
                sub._buffers[name] = torch.empty_like(b, device=target)
    return module


class LoadedCapture:
    """A capture artifact ready to replay: its typed ``manifest``, a ``resolver`` for its classes
    (stored script copies first), and readers of its inputs, outputs, weights, RNG state and
    gradients, on ``device`` and cast to ``dtype`` (floating tensors) when given."""

    def __init__(self, artifact: Artifact, device: str | None = None, dtype: torch.dtype | None = None):
        require_trusted(artifact, "replay it")  # decoding and building import the classes it names
        self.artifact = artifact
        self.manifest: CaptureManifest = capture_manifest(artifact)
        self.device = device
        self.dtype = dtype
        sources = {
            mod: (artifact.file(stored.file).read_text(), stored.original)
            for mod, stored in self.manifest.sources.items()
        }
        self.resolver = Resolver(sources, self.manifest.sys_path)
        self.synthesized: list[str] = []
        self.input_leaves: dict[int, torch.Tensor] = {}  # of the last inputs(): id of an activation -> its leaf

    # -- data ---------------------------------------------------------------------------------
    def _decoder(self, filename: str, *, device: str | None, dtype: torch.dtype | None,
                 placeholders: bool = False) -> Decoder:
        source = TensorSource(load_tensors(self.artifact, filename), device=device, dtype=dtype)
        return Decoder(source, self.resolver, self._build_nested, placeholders=placeholders)

    @functools.cached_property
    def _stored_inputs(self) -> dict[str, torch.Tensor]:
        return load_tensors(self.artifact, "inputs.safetensors")

    def inputs(self) -> tuple[list[Any], dict[str, Any]]:
        """The call's arguments as they were before the captured call. Every call rebuilds them:
        new tensors (copies of the stored ones, which are read once) and new objects around them,
        so a forward that changes what it is given (grows a key/value cache, updates a tensor in
        place) leaves the next call's arguments as captured. Run a module more than once on the
        captured inputs by calling this before each run, outside any timer."""
        source = TensorSource(self._stored_inputs, device=self.device, dtype=self.dtype)
        dec = Decoder(source, self.resolver, self._build_nested)
        args = dec.decode(self.manifest.inputs.args)
        kwargs = dec.decode(self.manifest.inputs.kwargs)
        self.synthesized += [k for k in source.synthesized if k not in self.synthesized]
        self.input_leaves = source.leaves  # ids of tensors from earlier calls may be reused
        return list(args), dict(kwargs)

    @property
    def changed_inputs(self) -> list[str]:
        """Keys of the input tensors the captured call changed (a cache it grew, a tensor updated
        in place): a module run twice on one set of :meth:`inputs` does not start the second run
        from the captured inputs."""
        return [key for key in self.manifest.state_after if not key.startswith(BUFFER_PREFIX)]

    def expected_outputs(self) -> Any:
        dec = self._decoder("outputs.safetensors", device="cpu", dtype=None)
        out = dec.decode(self.manifest.outputs)
        return out, dec.source.synthesized

    def weights(self) -> dict[str, torch.Tensor]:
        source = TensorSource(load_tensors(self.artifact, "weights.safetensors"), device=self.device, dtype=None)
        out = {name: source.get(spec) for name, spec in self.manifest.weight_specs().items()}
        self.synthesized += source.synthesized
        return out

    def rng(self) -> dict[str, torch.Tensor]:
        return load_tensors(self.artifact, "rng.safetensors")

    def grads(self) -> dict[str, torch.Tensor]:
        return load_tensors(self.artifact, "grads.safetensors")

    # -- modules ------------------------------------------------------------------------------
    @functools.cached_property
    def _init_decoder(self) -> Decoder:
        """Decodes constructor arguments (their tensors are read once, for all nested modules). A
        value that was not recorded becomes a placeholder that fails, naming it, only if used."""
        return self._decoder("init.safetensors", device=None, dtype=None, placeholders=True)

    def _build_nested(self, spec: ModuleSpec) -> torch.nn.Module:
        init_dec = self._init_decoder
        cls = self.resolver(spec.cls)
        args = [init_dec.decode(a) for a in spec.args]
        kwargs = {k: init_dec.decode(v) for k, v in spec.kwargs.items()}
        was = init_args._active
        if was:
            init_args.uninstall()
        try:
            return cls(*args, **kwargs)
        except ModuleLensError:
            raise  # a value that was not recorded, used by the constructor: the error names it
        except Exception as e:
            raise ReplayFailed(
                f"constructing {spec.cls} from the recorded arguments failed: {type(e).__name__}: {e}",
                "the class's constructor changed since the capture; use [--strategy export]",
            ) from e
        finally:
            if was:
                init_args.install()

    def build(self, strategy: str, trust_pickle: bool = False) -> torch.nn.Module:
        if strategy not in STRATEGIES:
            raise ReplayFailed(f"unknown strategy {strategy!r}", f"use one of: auto, {', '.join(STRATEGIES)}")
        if strategy not in self.manifest.strategies:
            why = "; ".join(self.manifest.notes) or "it was not saved at capture time"
            raise ReplayFailed(f"capture {self.artifact.ref} does not support the {strategy} strategy ({why})",
                               f"supported: {', '.join(self.manifest.strategies) or 'none'}")
        if strategy == "source":
            if self.manifest.init is None:
                raise ReplayFailed(f"capture {self.artifact.ref} has no recorded construction", "use [--strategy export]")
            module = _materialized(self._build_nested(self.manifest.init), self.device)
            init_args.restore_plain_attributes(module, self.manifest.attributes)
            self._load_weights(module)
        elif strategy == "export":
            module = self._exported()
        else:
            if not trust_pickle:
                raise ReplayFailed(
                    "the pickle strategy runs arbitrary code from the capture file",
                    "pass [--trust-pickle] only for captures you made yourself",
                )
            module = self._unpickle()
            self._load_weights(module)
        if self.dtype is not None:
            module = module.to(dtype=self.dtype)
        if self.device is not None:
            module = module.to(self.device)
        if strategy != "export":
            module.train(self.manifest.training)
        return module

    def with_strategy(
        self, strategy: str, trust_pickle: bool, action: Callable[[torch.nn.Module], T]
    ) -> tuple[T, str, float, list[tuple[str, str]]]:
        """Build the module with ``strategy`` (``auto``: source, export, then pickle if trusted;
        the next one is tried when building or ``action(module)`` fails) and run ``action`` on it.
        Returns (action's result, strategy used, build seconds, [(strategy, error) tried before])."""
        import time

        supported = self.manifest.strategies
        if strategy == "auto":
            order = [s for s in STRATEGIES if s in supported and (s != "pickle" or trust_pickle)]
            if not order:
                raise ReplayFailed(
                    f"capture {self.artifact.ref} supports no strategy that can run here "
                    f"(supported: {', '.join(supported) or 'none'})",
                    "; ".join(self.manifest.notes) or "capture again",
                )
        else:
            order = [strategy]
        attempts: list[tuple[str, str]] = []
        for s in order:
            try:
                t0 = time.perf_counter()
                module = self.build(s, trust_pickle=trust_pickle)
                build_s = time.perf_counter() - t0
                return action(module), s, build_s, attempts
            except ModuleLensError as e:
                if strategy != "auto":
                    raise
                attempts.append((s, str(e)))
            except Exception as e:  # noqa: BLE001 - a strategy that crashes is reported, the next one tried
                if strategy != "auto":
                    raise ReplayFailed(f"{s} replay failed: {type(e).__name__}: {e}") from e
                attempts.append((s, f"{type(e).__name__}: {e}"))
        raise ReplayFailed(
            f"no strategy could replay {self.artifact.ref}: " + "; ".join(f"{s}: {e}" for s, e in attempts),
            "see the errors above",
        )

    def _load_program(self) -> torch.nn.Module:
        """The saved program as a module, its custom operators registered first (see
        :mod:`modulelens.capture.custom_ops`); parameters saved without data are materialised."""
        info = self.manifest.export
        import_op_modules(info.custom_ops, self.resolver.module)
        path = self.artifact.file("program.pt2")
        try:
            program = torch.export.load(str(path)).module()
        except Exception:
            missing = missing_ops(path)  # a capture that did not record its operators' modules
            if missing:
                raise missing_op_error(missing[0], info.custom_ops.get(missing[0], [])) from None
            raise
        return _materialized(program, self.device)

    def _exported(self) -> torch.nn.Module:
        """The saved program as a module called like the captured one, with the captured weights."""
        program = self._load_program()
        info = self.manifest.export
        if info.calling == "call":
            self._load_weights(program, strict=False, complete=info.weights == "separate")
            return program
        module = LeafProgramCall(program, info.input_keys, info.returned_keys, self.manifest.outputs, self.resolver)
        self._load_weights(module, strict=False, prefix=LEAF_PROGRAM_PREFIX, complete=info.weights == "separate")
        return module

    def expected_values(self) -> dict[str, Any]:
        """The captured output's values other than tensors (ints, strings, None...) by key; empty
        when the output cannot be rebuilt here (a class that does not import)."""
        try:
            decoded = Decoder(_NoTensors({}), self.resolver, self._build_nested).decode(self.manifest.outputs)
        except ModuleLensError:
            return {}
        tensors = {t.key for t in self.manifest.output_leaves()}
        return {k: v for k, v in keyed_values(decoded, "output").items() if k not in tensors}

    def expected_tensors(self, filename: str, keys: list[str]) -> dict[str, torch.Tensor]:
        """The stored tensors of ``keys`` (those present) from one tensor file, on the CPU, read
        one by one."""
        if not keys or not self.artifact.has_file(filename):
            return {}
        with safe_open(str(self.artifact.file(filename)), framework="pt") as f:
            present = set(f.keys())
            return {k: f.get_tensor(k) for k in keys if k in present}

    def _load_weights(self, module: torch.nn.Module, strict: bool = True, prefix: str = "",
                      complete: bool = False) -> None:
        """Copy the captured weights into ``module``'s parameters and buffers under ``prefix``.
        ``strict``: every captured weight must have a place. ``complete``: every parameter of the
        module must get a captured value (a program saved without its weights)."""
        weights = self.weights()
        own = {n[len(prefix):]: t for n, t in module.named_parameters(remove_duplicate=False) if n.startswith(prefix)}
        own.update({n[len(prefix):]: t for n, t in module.named_buffers(remove_duplicate=False) if n.startswith(prefix)})
        missing = [n for n in weights if n not in own]
        if missing and strict:
            raise ReplayFailed(
                f"the rebuilt module has no parameter or buffer named {', '.join(missing[:5])}",
                "the model's code changed since the capture; use [--strategy export]",
            )
        unfilled = [n for n, _ in module.named_parameters(remove_duplicate=False) if n.startswith(prefix)
                    and n[len(prefix):] not in weights]
        if complete and unfilled:
            raise ReplayFailed(f"the capture has no weights for the program's parameters {', '.join(unfilled[:5])}",
                               "the capture is damaged; capture it again")
        with torch.no_grad():
            for name, value in weights.items():
                if name not in own:
                    continue
                target = own[name]
                if tuple(target.shape) != tuple(value.shape):
                    raise ReplayFailed(
                        f"{name} has shape {tuple(value.shape)} in the capture but {tuple(target.shape)} in the rebuilt module",
                        "the model's code or configuration changed since the capture",
                    )
                target.copy_(value.to(device=target.device, dtype=target.dtype))

    def _unpickle(self) -> torch.nn.Module:
        resolver = self.resolver
        sources = set(self.manifest.sources)

        class _Unpickler(pickle.Unpickler):
            def find_class(self, module: str, name: str) -> Any:
                if module in sources:
                    return resolver(f"{module}:{name}")
                return super().find_class(module, name)

        shim = type(pickle)("modulelens_pickle_shim")
        shim.__dict__.update(pickle.__dict__)
        shim.Unpickler = _Unpickler  # type: ignore[attr-defined]
        data = self.artifact.file("module.pkl").read_bytes()
        try:
            return torch.load(io.BytesIO(data), weights_only=False, pickle_module=shim, map_location="cpu")
        except ModuleLensError:
            raise
        except Exception as e:
            raise ReplayFailed(f"unpickling the module failed: {type(e).__name__}: {e}", "use [--strategy source] or [--strategy export]") from e
