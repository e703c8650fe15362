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

from modulelens.capture import init_args
from modulelens.capture.artifact import load_tensors
from modulelens.capture.manifest import CaptureManifest, capture_manifest
from modulelens.capture.sources import Resolver
from modulelens.capture.spec import ModuleSpec
from modulelens.capture.values import Decoder, TensorSource
from modulelens.errors import ModuleLensError, ReplayFailed
from modulelens.repo import Artifact
from modulelens.repo.trust import require_trusted

STRATEGIES = ("source", "export", "pickle")
T = TypeVar("T")


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

    # -- data ---------------------------------------------------------------------------------
    def _decoder(self, filename: str, *, device: str | None, dtype: torch.dtype | None) -> Decoder:
        source = TensorSource(load_tensors(self.artifact, filename), device=device, dtype=dtype)
        return Decoder(source, self.resolver, self._build_nested)

    def inputs(self) -> tuple[list[Any], dict[str, Any]]:
        dec = self._decoder("inputs.safetensors", device=self.device, dtype=self.dtype)
        args = dec.decode(self.manifest.inputs.args)
        kwargs = dec.decode(self.manifest.inputs.kwargs)
        self.synthesized += dec.source.synthesized
        return list(args), dict(kwargs)

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
        """Decodes constructor arguments (their tensors are read once, for all nested modules)."""
        return self._decoder("init.safetensors", device=None, dtype=None)

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
        except Exception as e:
            raise ReplayFailed(
                f"constructing {spec.cls} from the recorded arguments failed: {type(e).__name__}: {e}",
                "the class's constructor changed since the capture; use --strategy export",
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
                raise ReplayFailed(f"capture {self.artifact.ref} has no recorded construction", "use --strategy export")
            module = self._build_nested(self.manifest.init)
            self._load_weights(module)
        elif strategy == "export":
            program = torch.export.load(str(self.artifact.file("program.pt2")))
            module = program.module()
            self._load_weights(module, strict=False)
        else:
            if not trust_pickle:
                raise ReplayFailed(
                    "the pickle strategy runs arbitrary code from the capture file",
                    "pass --trust-pickle only for captures you made yourself",
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

    def _load_weights(self, module: torch.nn.Module, strict: bool = True) -> None:
        weights = self.weights()
        own = dict(module.named_parameters(remove_duplicate=False))
        own.update(dict(module.named_buffers(remove_duplicate=False)))
        missing = [n for n in weights if n not in own]
        if missing and strict:
            raise ReplayFailed(
                f"the rebuilt module has no parameter or buffer named {', '.join(missing[:5])}",
                "the model's code changed since the capture; use --strategy export",
            )
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
            raise ReplayFailed(f"unpickling the module failed: {type(e).__name__}: {e}", "use --strategy source or export") from e
