"""How operator calls reach a pack's tables: ``torch.library`` kernels, a dispatch mode, and the
bridge that serves calls made under ``torch.inference_mode``.

* ``library`` (default): a Python kernel registered with ``torch.library.Library("aten", "IMPL")``
  for each packed operator on the ``ADInplaceOrView`` key. That key sits below autograd (so
  gradients are recorded as usual around the pack kernel, and backward-phase operators called by
  the autograd engine pass through it too) and above the backend keys, so a call that does not
  match is sent on below that key (the operator called again under
  ``_AutoDispatchBelowADInplaceOrView``) to the original CPU/CUDA/Meta kernel, untouched.
  Registering on the CPU key itself would override the original kernel, leaving nothing to send
  the call on to. Operators that have their own ``ADInplaceOrView``
  kernel (in-place and view operators) are not intercepted this way. Operators without entries
  are never touched: they cost nothing. Inference mode excludes the ``ADInplaceOrView`` key, so
  while a library kernel is registered, entering ``torch.inference_mode`` (the context manager or
  the decorator) also enters :class:`InferenceBridge`, a dispatch mode that serves the packed
  operators from the same tables for the duration (and a runtime activated while inference mode
  is already on enters one itself): inference-mode calls are served or counted as misses, never
  silently bypassed.
* ``mode``: a ``TorchDispatchMode`` that sees every aten call and looks it up in the table.
  Every operator, packed or not, pays a trip through Python.

``benchmarks/pack_overhead.py`` measures both; ``library`` is the cheaper one.

A table (:class:`~modulelens.dispatch.runtime.OpTable`) belongs to one runtime; ``serve`` asks the
runtime whether operator dispatch is on now (its block or model is running, not paused, not
inside a module entry's own forward or backward) and which training flag to guard with.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from modulelens.dispatch.patterns import call_key

_BRIDGE = threading.local()  # .serving: a bridge is serving a call on this thread (nested bridges pass through)


def serve(users: list[Any], args: tuple, kwargs: dict, run: Callable[[Any], Any], eager: Callable[[], Any]) -> Any:
    """The call ``args, kwargs`` of an operator whose tables are ``users`` (most recent last): the
    most recent table whose runtime is dispatching now decides (its kernel through ``run``, or
    eager counted as a miss); with none, eager uncounted."""
    for table in reversed(users):
        runtime = table.runtime
        if not runtime.op_dispatch_on():
            continue
        key = call_key(args, kwargs, runtime.training if table.guards_training else None)
        live = table.lookup(key)
        if live is None:
            table.misses[key] += 1
            break
        return table.run(live, run, eager)
    return eager()


class _LibraryKernels:
    """The process's one ``torch.library`` kernel per intercepted operator (a second registration
    would replace the first). Every runtime that intercepts the operator adds its table; a call
    goes to the most recently added table whose runtime is dispatching, else straight to the
    original kernel. An operator's kernel is removed when its last table is."""

    def __init__(self) -> None:
        self.tables: dict[Any, list[Any]] = {}
        self.libs: dict[Any, torch.library.Library] = {}

    def add(self, op: torch._ops.OpOverload, table: Any) -> None:
        if op not in self.tables:
            self.tables[op] = []
            lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - overriding aten kernels is the point
            name = op.name().split("::", 1)[1]  # "mul.Tensor"; a default overload is named without a suffix
            lib.impl(name, self._kernel(op, self.tables[op]), "ADInplaceOrView", with_keyset=True)
            self.libs[op] = lib
        self.tables[op].append(table)
        _patch_inference_mode()

    def remove(self, op: torch._ops.OpOverload, table: Any) -> None:
        users = self.tables.get(op, [])
        users[:] = [u for u in users if u is not table]
        if not users and op in self.libs:
            self.libs.pop(op)._destroy()
            del self.tables[op]
        if not self.tables:
            _unpatch_inference_mode()

    @staticmethod
    def _kernel(op: torch._ops.OpOverload, users: list[Any]) -> Callable[..., Any]:
        """The Python kernel of ``op``. Its eager path calls ``op`` again below this key (not
        ``op.redispatch``: a Python number that arrived for a Tensor argument, ``x * 0.5`` reaching
        ``mul.Tensor``, is converted back by the call, not by a redispatch)."""

        def kernel(keyset, *args, **kwargs):
            def run(live: Any) -> Any:
                with torch._C._AutoDispatchBelowADInplaceOrView():  # what the kernel calls is not intercepted again
                    return live.impl(*args, *kwargs.values())

            def eager() -> Any:
                with torch._C._AutoDispatchBelowADInplaceOrView():
                    return op(*args, **kwargs)

            return serve(users, args, kwargs, run, eager)

        return kernel


LIBRARY = _LibraryKernels()


class LibraryInterceptor:
    """Python kernels on the ADInplaceOrView key (see the module docstring)."""

    def __init__(self, tables: dict[Any, Any]):
        self.tables = tables

    @staticmethod
    def unsupported(op: torch._ops.OpOverload) -> str | None:
        if op in LIBRARY.libs:
            return None
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), torch._C.DispatchKey.ADInplaceOrView):
            return "in-place and view operators are not intercepted (they have their own ADInplaceOrView kernel)"
        return None

    def install(self) -> None:
        for op, table in self.tables.items():
            LIBRARY.add(op, table)

    def uninstall(self) -> None:
        for op, table in self.tables.items():
            LIBRARY.remove(op, table)


class ModeInterceptor(TorchDispatchMode):
    """A TorchDispatchMode over every aten call (see the module docstring)."""

    def __init__(self, tables: dict[Any, Any]):
        super().__init__()
        self.tables = tables

    @staticmethod
    def unsupported(op: torch._ops.OpOverload) -> str | None:
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        table = self.tables.get(func)
        if table is None:
            return func(*args, **kwargs)
        return serve([table], args, kwargs, lambda live: live.impl(*args, *kwargs.values()),
                     lambda: func(*args, **kwargs))

    def install(self) -> None:
        self.__enter__()

    def uninstall(self) -> None:
        self.__exit__(None, None, None)


class InferenceBridge(TorchDispatchMode):
    """Entered with ``torch.inference_mode`` while library kernels are registered: serves the
    packed operators from their tables (inference mode skips the ADInplaceOrView key)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        users = LIBRARY.tables.get(func)
        if not users or not torch.is_inference_mode_enabled() or getattr(_BRIDGE, "serving", False):
            return func(*args, **kwargs)
        _BRIDGE.serving = True
        try:
            return serve(users, args, kwargs, lambda live: live.impl(*args, *kwargs.values()),
                         lambda: func(*args, **kwargs))
        finally:
            _BRIDGE.serving = False


def enter_bridge_if_inference() -> InferenceBridge | None:
    """An entered :class:`InferenceBridge` when inference mode is on now (else None): for a
    runtime activated inside an inference-mode block entered before its kernels were registered."""
    if not torch.is_inference_mode_enabled():
        return None
    bridge = InferenceBridge()
    bridge.__enter__()
    return bridge


_ORIGINAL: dict[str, Any] = {}


def _patch_inference_mode() -> None:
    """Make ``torch.inference_mode`` enter an :class:`InferenceBridge` (once; undone by
    :func:`_unpatch_inference_mode` when the last library kernel goes)."""
    cls = torch.autograd.grad_mode.inference_mode
    if _ORIGINAL:
        return
    _ORIGINAL.update(enter=cls.__enter__, exit=cls.__exit__)

    def enter(self: Any) -> None:
        _ORIGINAL["enter"](self)
        if torch.is_inference_mode_enabled() and LIBRARY.tables:
            bridge = InferenceBridge()
            bridge.__enter__()
            self._modulelens_bridge = bridge

    def exit(self: Any, *exc: Any) -> None:
        bridge = self.__dict__.pop("_modulelens_bridge", None)
        if bridge is not None:
            bridge.__exit__(None, None, None)
        return _ORIGINAL["exit"](self, *exc)

    cls.__enter__, cls.__exit__ = enter, exit  # type: ignore[method-assign]


def _unpatch_inference_mode() -> None:
    if _ORIGINAL:
        cls = torch.autograd.grad_mode.inference_mode
        cls.__enter__, cls.__exit__ = _ORIGINAL.pop("enter"), _ORIGINAL.pop("exit")  # type: ignore[method-assign]
