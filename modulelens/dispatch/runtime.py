"""Guarded dispatch of a loaded pack: which calls go to a pack kernel, and what happened.

Only entries that were validated correct and surely beat eager (the lower bound of their speedup
interval above 1, or packed with force) are dispatched (:meth:`PackEntry.skip_reason` says why
others are not). A call reaches an entry's kernel only when its :func:`call_key` equals
the entry's validated key; otherwise it runs eager and counts as a fallback of the closest entry
of the same operator or module, with the first difference as its reason (worked out when the
report is made, so the miss path only counts). A kernel that raises falls back to eager for that
call and the exception is counted as the reason.

Operator entries are intercepted in one of two ways (``mechanism``):

* ``library`` (default): a Python kernel registered with ``torch.library.Library("aten", "IMPL")``
  for each packed operator on the ``ADInplaceOrView`` key. That key sits below autograd (so
  gradients are recorded as usual around the pack kernel) and above the backend keys, so a call
  that does not match is sent on with ``op.redispatch(keyset & after_ADInplaceOrView_keyset)``,
  the original CPU/CUDA/Meta kernel, untouched. Registering on the CPU key itself would override
  the original kernel, leaving nothing to redispatch to. Operators that have their own
  ``ADInplaceOrView`` kernel (in-place and view operators) are not intercepted this way.
  Operators without entries are never touched: they cost nothing.
* ``mode``: a ``TorchDispatchMode`` that sees every aten call and looks it up in the table.
  Every operator, packed or not, pays a trip through Python.

``benchmarks/pack_overhead.py`` measures both; ``library`` is the cheaper one.

Module entries replace ``forward`` of the module at the entry's module path whose class matches,
on each model the runtime is given (:meth:`PackRuntime.patch_model`); the replacement
``ModelNew`` is built with the captured constructor arguments and shares the live module's
parameters and buffers (so training updates reach both).
"""

from __future__ import annotations

import base64
import collections
import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from modulelens.dispatch.pack import LoadedPackFile, PackEntry
from modulelens.dispatch.patterns import call_key, difference, distance, pattern_key

Mechanism = Literal["library", "mode"]
MECHANISMS: tuple[str, ...] = ("library", "mode")
DEFAULT_MECHANISM: Mechanism = "library"
_AFTER_ADINPLACE = torch._C._after_ADInplaceOrView_keyset


class EntryReport(BaseModel):
    candidate_id: str
    kind: str
    target: str = Field(description="aten overload (op entries) or class at module path (module entries).")
    dispatched: bool = Field(description="False when the entry is never used; skip_reason says why.")
    skip_reason: str | None = None
    speedup_vs_eager: float | None = None
    hits: int = 0
    fallbacks: int = 0
    fallback_reasons: dict[str, int] = Field(default_factory=dict)


class DispatchReport(BaseModel):
    pack: str
    sha256: str
    mechanism: str
    hits: int = 0
    fallbacks: int = 0
    entries: list[EntryReport] = Field(default_factory=list)
    environment_notes: list[str] = Field(default_factory=list)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"kernel raised {type(e).__name__}: {text[0][:200] if text else ''}".rstrip(": ")


class _Live:
    """One dispatched entry: its validated key, its callable, its counters."""

    def __init__(self, entry: PackEntry, impl: Any):
        self.entry = entry
        self.key = pattern_key(entry.pattern)
        self.impl = impl
        self.hits = 0
        self.raised: collections.Counter[str] = collections.Counter()


class _Guarded:
    """The entries of one operator or one module path, keyed by validated call key."""

    def __init__(self, lives: list[_Live]):
        self.by_key = {x.key: x for x in lives}
        self.lives = lives
        self.misses: collections.Counter[tuple] = collections.Counter()

    def call(self, key: tuple, run: Callable[[_Live], Any], eager: Callable[[], Any]) -> Any:
        live = self.by_key.get(key)
        if live is None:
            self.misses[key] += 1
            return eager()
        return self.run(live, run, eager)

    def run(self, live: _Live, run: Callable[[_Live], Any], eager: Callable[[], Any]) -> Any:
        """Run ``live``'s kernel; eager (and the exception counted) if it raises."""
        try:
            out = run(live)
        except Exception as e:  # noqa: BLE001 - a failing pack kernel falls back to eager and is reported
            live.raised[_first_line(e)] += 1
            return eager()
        live.hits += 1
        return out

    def fallbacks(self) -> dict[int, collections.Counter[str]]:
        """id(live) -> reasons of the calls that did not reach it (misses attributed to the closest)."""
        out: dict[int, collections.Counter[str]] = {id(x): collections.Counter(x.raised) for x in self.lives}
        for key, n in self.misses.items():
            closest = min(self.lives, key=lambda x: distance(key, x.key))
            out[id(closest)][difference(key, closest.key)] += n
        return out


class _OpTable(_Guarded):
    def __init__(self, op: torch._ops.OpOverload, lives: list[_Live]):
        super().__init__(lives)
        self.op = op


def _run_kernel(args: tuple, kwargs: dict) -> Callable[[_Live], Any]:
    return lambda live: live.impl(*args, *kwargs.values())


class _LibraryKernels:
    """The process's one ``torch.library`` kernel per intercepted operator (a second registration
    would replace the first). Every runtime that intercepts the operator adds its table; a call
    goes to the most recently added table whose runtime is active, else straight to the original
    kernel. An operator's kernel is removed when its last table is."""

    def __init__(self) -> None:
        self.tables: dict[Any, list[tuple[_OpTable, Callable[[], bool]]]] = {}
        self.libs: dict[Any, torch.library.Library] = {}

    def add(self, op: torch._ops.OpOverload, table: _OpTable, active: Callable[[], bool]) -> None:
        if op not in self.tables:
            self.tables[op] = []
            lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - overriding aten kernels is the point
            name = op.name().split("::", 1)[1] + ("" if op._overloadname == "default" else f".{op._overloadname}")
            lib.impl(name, self._kernel(op, self.tables[op]), "ADInplaceOrView", with_keyset=True)
            self.libs[op] = lib
        self.tables[op].append((table, active))

    def remove(self, op: torch._ops.OpOverload, table: _OpTable) -> None:
        users = self.tables.get(op, [])
        users[:] = [u for u in users if u[0] is not table]
        if not users and op in self.libs:
            self.libs.pop(op)._destroy()
            del self.tables[op]

    @staticmethod
    def _kernel(op: torch._ops.OpOverload, users: list[tuple[_OpTable, Callable[[], bool]]]) -> Callable[..., Any]:
        redispatch = op.redispatch

        def kernel(keyset, *args, **kwargs):
            below = keyset & _AFTER_ADINPLACE
            for table, active in reversed(users):
                if not active():
                    continue
                key = call_key(args, kwargs)
                live = table.by_key.get(key)
                if live is None:
                    table.misses[key] += 1
                    break

                def run(live: _Live) -> Any:
                    with torch._C._AutoDispatchBelowADInplaceOrView():  # what the kernel calls is not intercepted again
                        return live.impl(*args, *kwargs.values())

                return table.run(live, run, lambda: redispatch(below, *args, **kwargs))
            return redispatch(below, *args, **kwargs)

        return kernel


_LIBRARY = _LibraryKernels()


class _LibraryInterceptor:
    """Python kernels on the ADInplaceOrView key (see the module docstring)."""

    def __init__(self, tables: dict[Any, _OpTable], active: Callable[[], bool]):
        self.tables = tables
        self.active = active

    @staticmethod
    def unsupported(op: torch._ops.OpOverload) -> str | None:
        if op in _LIBRARY.libs:
            return None
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), torch._C.DispatchKey.ADInplaceOrView):
            return "in-place and view operators are not intercepted (they have their own ADInplaceOrView kernel)"
        return None

    def install(self) -> None:
        for op, table in self.tables.items():
            _LIBRARY.add(op, table, self.active)

    def uninstall(self) -> None:
        for op, table in self.tables.items():
            _LIBRARY.remove(op, table)


class _ModeInterceptor(torch.utils._python_dispatch.TorchDispatchMode):
    """A TorchDispatchMode over every aten call (see the module docstring)."""

    def __init__(self, tables: dict[Any, _OpTable], active: Callable[[], bool]):
        super().__init__()
        self.tables = tables
        self.active = active

    @staticmethod
    def unsupported(op: torch._ops.OpOverload) -> str | None:
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        table = self.tables.get(func)
        if table is None or not self.active():
            return func(*args, **kwargs)
        return table.call(call_key(args, kwargs), _run_kernel(args, kwargs), lambda: func(*args, **kwargs))

    def install(self) -> None:
        self.__enter__()

    def uninstall(self) -> None:
        self.__exit__(None, None, None)


class _ModuleReplacement:
    """A module entry on one live module: a ``ModelNew`` sharing the module's parameters."""

    def __init__(self, cls: type, entry: PackEntry, tensors: dict[str, torch.Tensor]):
        self.cls, self.entry, self.tensors = cls, entry, tensors

    def build(self, live: torch.nn.Module) -> torch.nn.Module:
        """Construct ``ModelNew`` and give it ``live``'s parameters. The RNG state is restored
        afterwards: initialising the new module's (discarded) weights must not shift the
        random numbers the user's run draws next (dropout masks, data)."""
        from modulelens.capture.tracer import rng_states, set_rng_states
        from modulelens.kernels.module_candidates import construct

        init = self.entry.init
        assert init is not None
        state = rng_states()
        try:
            new = construct(self.cls, init.args, init.kwargs, self.tensors, init.sys_path)
        finally:
            set_rng_states(state)
        share_state(new, live)
        return new.train(live.training)


def share_state(new: torch.nn.Module, live: torch.nn.Module) -> None:
    """Make ``new``'s parameters and buffers the very tensors of ``live`` (same names required)."""
    own = dict(live.named_parameters(remove_duplicate=False)) | dict(live.named_buffers(remove_duplicate=False))
    names = [n for n, _ in new.named_parameters(remove_duplicate=False)] + [n for n, _ in new.named_buffers(remove_duplicate=False)]
    missing = sorted(set(names) - set(own))
    if missing:
        raise ValueError(f"ModelNew has parameters the module does not: {', '.join(missing[:5])}")
    for name in names:
        owner_path, _, leaf = name.rpartition(".")
        owner = new.get_submodule(owner_path) if owner_path else new
        value = own[name]
        if isinstance(value, torch.nn.Parameter):
            owner._parameters[leaf] = value
        else:
            owner._buffers[leaf] = value


class PackRuntime:
    """A verified pack, built and ready to intercept. ``install()``/``uninstall()`` the operator
    interceptor; ``patch_model(model)`` replaces matching modules' forward; ``report()``."""

    def __init__(self, pack: LoadedPackFile, mechanism: Mechanism = DEFAULT_MECHANISM):
        if mechanism not in MECHANISMS:
            from modulelens.errors import ModuleLensError

            raise ModuleLensError(f"unknown dispatch mechanism {mechanism!r}", "use library or mode")
        self.pack = pack
        self.mechanism = mechanism
        self.depth = 0  # > 0 while dispatch is active (use_pack's block, or an applied model's forward)
        self.paused = False  # set by pause(): everything runs eager, nothing is counted
        self.skipped: dict[int, str] = {}
        self.tables: dict[Any, _OpTable] = {}
        self.modules: dict[tuple[str, str], tuple[_Guarded, _ModuleReplacement]] = {}
        self.patched: list[tuple[torch.nn.Module, Any]] = []
        interceptor_cls = _LibraryInterceptor if mechanism == "library" else _ModeInterceptor
        by_op: dict[Any, list[_Live]] = {}
        for i, entry in enumerate(pack.content.entries):
            reason = entry.skip_reason()
            if reason is None:
                try:
                    if entry.kind == "op":
                        op = _resolve(entry.op or "")
                        reason = interceptor_cls.unsupported(op)
                        if reason is None:
                            by_op.setdefault(op, []).append(_Live(entry, _build_kernel(entry)))
                    else:
                        self._add_module_entry(entry)
                except Exception as e:  # noqa: BLE001 - an entry that cannot be built here is reported, not fatal
                    reason = f"cannot be built here: {type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
            if reason is not None:
                self.skipped[i] = reason
        self.tables = {op: _OpTable(op, lives) for op, lives in by_op.items()}
        self.interceptor = interceptor_cls(self.tables, lambda: self.depth > 0 and not self.paused)
        self.installed = False

    def _add_module_entry(self, entry: PackEntry) -> None:
        from modulelens.kernels.module_candidates import load_class

        cls = load_class(entry.source, entry.entry)
        tensors: dict[str, torch.Tensor] = {}
        if entry.init and entry.init.tensors_b64:
            from safetensors.torch import load

            tensors = load(base64.b64decode(entry.init.tensors_b64))
        where = (entry.class_path or "", entry.module_path or "")
        guarded = self.modules[where][0] if where in self.modules else _Guarded([])
        live = _Live(entry, None)
        guarded.lives.append(live)
        guarded.by_key[live.key] = live
        self.modules[where] = (guarded, _ModuleReplacement(cls, entry, tensors))

    # -- operators ----------------------------------------------------------------------------
    def install(self) -> None:
        """Register the library kernels (a no-op for ``mode``, which is entered on activation)."""
        if not self.installed and self.tables and self.mechanism == "library":
            self.interceptor.install()
        self.installed = True

    def activate(self) -> None:
        """Start dispatching (nests): entered by use_pack's block and by an applied model's forward."""
        self.depth += 1
        if self.depth == 1 and self.tables and self.mechanism == "mode" and not self.paused:
            self.interceptor.install()

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Run everything eager inside the block, uncounted (to time eager on the same model)."""
        was, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = was

    def switch(self, on: bool) -> None:
        """Switch dispatch on or off between a script's steps (``run --compare`` times both in one
        process): off, the interceptor is taken out entirely (both mechanisms), so an off step
        costs what a step without the pack costs but for the patched modules' forward, which
        checks this switch and calls the original."""
        if on != self.paused:
            return
        self.paused = not on
        if not self.tables or not self.installed:
            return
        if self.mechanism == "library" or self.depth > 0:
            if on:
                self.interceptor.install()
            else:
                self.interceptor.uninstall()

    def deactivate(self) -> None:
        self.depth -= 1
        if self.depth == 0 and self.tables and self.mechanism == "mode" and not self.paused:
            self.interceptor.uninstall()

    def uninstall(self) -> None:
        """Remove the interceptor and restore every patched module's forward."""
        while self.depth > 0:
            self.deactivate()
        if self.installed and self.tables and self.mechanism == "library":
            self.interceptor.uninstall()
        self.installed = False
        for module, previous in reversed(self.patched):
            if previous is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = previous
        self.patched.clear()

    # -- modules ------------------------------------------------------------------------------
    def patch_model(self, model: torch.nn.Module, root_path: str = "") -> int:
        """Replace ``forward`` of every module of ``model`` that a module entry targets (same class
        path, same qualified name; ``root_path`` is ``model``'s own name when it is a submodule of
        the model the entries name, e.g. a replayed capture). Returns how many were patched."""
        if not self.modules:
            return 0
        from modulelens.capture.values import class_path

        n = 0
        for name, module in model.named_modules():
            path = ".".join(p for p in (root_path, name) if p)
            found = self.modules.get((class_path(module), path))
            if found is None or getattr(module.forward, "__modulelens_pack__", False):
                continue
            self.patched.append((module, module.__dict__.get("forward")))
            module.forward = self._guarded_forward(module, *found)
            n += 1
        return n

    def _guarded_forward(self, module: torch.nn.Module, guarded: _Guarded, repl: _ModuleReplacement) -> Callable:
        original = module.forward
        built: list[torch.nn.Module] = []

        def run(args: tuple, kwargs: dict) -> Callable[[_Live], Any]:
            def go(live: _Live) -> Any:
                if not built:
                    built.append(repl.build(module))
                new = built[0]
                new.training = module.training
                return new(*args, **kwargs)
            return go

        runtime = self

        def forward(*args: Any, **kwargs: Any) -> Any:
            if runtime.paused:
                return original(*args, **kwargs)
            return guarded.call(call_key(args, kwargs, training=module.training), run(args, kwargs),
                                lambda: original(*args, **kwargs))

        forward.__modulelens_pack__ = True  # type: ignore[attr-defined]
        return forward

    # -- report -------------------------------------------------------------------------------
    def report(self) -> DispatchReport:
        lives: dict[int, tuple[_Live, collections.Counter[str]]] = {}
        for guarded in [*self.tables.values(), *(g for g, _ in self.modules.values())]:
            reasons = guarded.fallbacks()
            for live in guarded.lives:
                lives[id(live.entry)] = (live, reasons[id(live)])
        out = DispatchReport(pack=self.pack.path, sha256=self.pack.sha256, mechanism=self.mechanism,
                             environment_notes=self.pack.environment_notes)
        for i, entry in enumerate(self.pack.content.entries):
            target = entry.op if entry.kind == "op" else f"{entry.class_path} at {entry.module_path}"
            rep = EntryReport(candidate_id=entry.candidate_id, kind=entry.kind, target=target or "",
                              dispatched=i not in self.skipped, skip_reason=self.skipped.get(i),
                              speedup_vs_eager=entry.speedup_vs_eager)
            if id(entry) in lives:
                live, reasons = lives[id(entry)]
                rep.hits, rep.fallbacks = live.hits, sum(reasons.values())
                rep.fallback_reasons = dict(reasons.most_common())
            out.entries.append(rep)
        out.hits = sum(e.hits for e in out.entries)
        out.fallbacks = sum(e.fallbacks for e in out.entries)
        return out


def _resolve(op_name: str) -> torch._ops.OpOverload:
    from modulelens.ops.recorder import resolve_op

    return resolve_op(op_name)


def _build_kernel(entry: PackEntry) -> Callable[..., Any]:
    from modulelens.kernels.backends import get_backend
    from modulelens.kernels.backends.base import default_build_dir

    backend = get_backend(entry.backend)
    status = backend.status()
    if not status.can_run:
        raise RuntimeError(f"{entry.backend} kernels cannot run here: {status.why}")
    return backend.load(entry.source, entry.entry, default_build_dir())
