"""The Python ways in: ``with modulelens.use_pack(path): ...`` and ``modulelens.apply_pack(model, path)``.

``use_pack`` dispatches every matching operator call made inside its block (any model, forward
and backward), and patches the module entries' targets in each model whose forward is called
inside the block (the first module called that is not part of an already seen model counts as a
model's root; the training flag operator entries guard is the last root's as its forward starts).
``apply_pack`` patches one model now and dispatches operator calls while that model's forward runs
and while a backward pass runs through that forward's outputs (from the first gradient reaching
them to the end of the pass); ``remove()`` undoes it. Both refuse a tampered pack or one from
another environment (see :func:`modulelens.dispatch.pack.read_pack`), and both give a
:class:`DispatchReport` with the hits (per phase) and fallbacks per entry. Calls under
``torch.inference_mode`` are served or counted like the others
(:mod:`modulelens.dispatch.interceptors`).
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch

from modulelens.capture import tensors_in
from modulelens.dispatch.pack import read_pack
from modulelens.dispatch.runtime import DEFAULT_MECHANISM, DispatchReport, Mechanism, PackRuntime


def load_runtime(path: str | os.PathLike[str], *, allow_env_mismatch: bool = False, expect_sha256: str | None = None,
                 mechanism: Mechanism = DEFAULT_MECHANISM) -> PackRuntime:
    """Verify the pack at ``path`` and build its entries (C++ builds are cached by source hash)."""
    return PackRuntime(read_pack(path, allow_env_mismatch=allow_env_mismatch, expect_sha256=expect_sha256), mechanism)


class use_pack:
    """Dispatch a pack's kernels to the matching calls made inside the block::

        with modulelens.use_pack("model.pack") as pack:
            train()
        print(pack.report().hits)
    """

    def __init__(self, path: str | os.PathLike[str], *, allow_env_mismatch: bool = False,
                 expect_sha256: str | None = None, mechanism: Mechanism = DEFAULT_MECHANISM):
        self.runtime = load_runtime(path, allow_env_mismatch=allow_env_mismatch, expect_sha256=expect_sha256,
                                    mechanism=mechanism)
        self._hook: Any = None
        self._seen: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()

    def _patch_new_root(self, module: torch.nn.Module, args: Any) -> None:
        if module not in self._seen:
            for _, sub in module.named_modules():
                self._seen.add(sub)
            self._roots.add(module)
            self.runtime.patch_model(module)
        if module in self._roots:
            self.runtime.training = module.training

    def __enter__(self) -> use_pack:
        self._roots: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self.runtime.install()
        if self.runtime.modules or self.runtime.tables:
            self._hook = torch.nn.modules.module.register_module_forward_pre_hook(self._patch_new_root)
        self.runtime.activate()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.runtime.uninstall()

    def report(self) -> DispatchReport:
        return self.runtime.report()


class AppliedPack:
    """A pack applied to one model: ``report()`` and ``remove()``."""

    def __init__(self, model: torch.nn.Module, runtime: PackRuntime, root_path: str = ""):
        self.model = model
        self.runtime = runtime
        runtime.install()
        self.patched = runtime.patch_model(model, root_path)
        self._hooks = [model.register_forward_pre_hook(self._started),
                       model.register_forward_hook(self._ended, always_call=True)]

    def _started(self, model: torch.nn.Module, args: Any) -> None:
        self.runtime.training = model.training
        self.runtime.activate()

    def _ended(self, model: torch.nn.Module, args: Any, output: Any) -> None:
        self.runtime.deactivate()
        if self.runtime.tables and torch.is_grad_enabled():
            first = next((t for t in tensors_in(output) if t.grad_fn is not None), None)
            if first is not None:
                first.grad_fn.register_prehook(self._backward_started)

    def _backward_started(self, grads: Any) -> None:
        """A backward pass reached the model's output: dispatch until the pass ends."""
        self.runtime.activate()
        torch.autograd.Variable._execution_engine.queue_callback(self.runtime.deactivate)

    def report(self) -> DispatchReport:
        return self.runtime.report()

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.runtime.uninstall()


def apply_pack(model: torch.nn.Module, path: str | os.PathLike[str], *, allow_env_mismatch: bool = False,
               expect_sha256: str | None = None, mechanism: Mechanism = DEFAULT_MECHANISM) -> AppliedPack:
    """Apply a pack to ``model`` (unmodified): matching calls inside its forward go to the pack's
    kernels, everything else runs eager. Returns a handle with ``report()`` and ``remove()``."""
    return AppliedPack(model, load_runtime(path, allow_env_mismatch=allow_env_mismatch, expect_sha256=expect_sha256,
                                           mechanism=mechanism))
