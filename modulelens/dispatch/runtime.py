"""Guarded dispatch of a loaded pack: which calls go to a pack kernel, and what happened.

Only entries that were validated correct and surely beat eager (the lower bound of their speedup
interval above 1, or packed with force) are dispatched (:meth:`PackEntry.skip_reason` says why
others are not). A call reaches an entry's kernel only when its :func:`call_key` is one of
the entry's validated keys (:func:`pattern_keys`: arguments, mode, training flag) or fits the
entry's checked shape rule (:class:`~modulelens.dispatch.rules.RuleGuard`; admitted keys are
remembered, so the next call of that shape is an exact lookup); otherwise it runs eager and counts
as a fallback of the closest entry of the same operator or module, with the first difference as
its reason (worked out when the report is made, so the miss path only counts). A kernel that
raises falls back to eager for that call and the exception is counted as the reason.

Operator entries guard the training flag of the model running (set when a model's forward starts:
the model ``apply_pack`` was given, or each top-level model ``use_pack`` sees) when their pattern
records one; how calls reach them (``library`` or ``mode``, inference mode included) is
:mod:`modulelens.dispatch.interceptors`. Operator calls made by the autograd engine are dispatched
like any other: an entry validated on a backward-phase card serves ``loss.backward()``. Hits are
counted per phase (``backward`` while the autograd engine runs a backward pass).

Module entries load the extensions validation verified (:mod:`modulelens.dispatch.builds`), and
replace ``forward`` of the module at the entry's module path whose class matches,
on each model the runtime is given (:meth:`PackRuntime.patch_model`); see
:mod:`modulelens.dispatch.modules`, which also keeps a module entry and the operator entries inside
it from both firing on one call.
"""

from __future__ import annotations

import base64
import collections
import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from modulelens.dispatch.builds import build_notes
from modulelens.dispatch.interceptors import LibraryInterceptor, ModeInterceptor, enter_bridge_if_inference
from modulelens.dispatch.modules import ModuleReplacement, guarded_forward, own_backward_node
from modulelens.dispatch.pack import LoadedPackFile, PackEntry
from modulelens.dispatch.patterns import difference, distance, pattern_keys
from modulelens.dispatch.rules import RuleGuard

Mechanism = Literal["library", "mode"]
MECHANISMS: tuple[str, ...] = ("library", "mode")
DEFAULT_MECHANISM: Mechanism = "library"
MAX_ADMITTED_KEYS = 4096  # shapes a rule admitted, remembered per operator or module for exact lookups
_graph_task_id = torch._C._current_graph_task_id


class EntryReport(BaseModel):
    candidate_id: str
    kind: str
    target: str = Field(description="aten overload (op entries) or class at module path (module entries).")
    dispatched: bool = Field(description="False when the entry is never used; skip_reason says why.")
    skip_reason: str | None = None
    speedup_vs_eager: float | None = None
    shape_rule: str | None = Field(None, description="The checked shape rule it admits calls by (else exact shapes).")
    hits: int = 0
    hits_by_phase: dict[str, int] = Field(default_factory=dict, description="forward / backward.")
    fallbacks: int = 0
    fallback_reasons: dict[str, int] = Field(default_factory=dict)
    builds: list[str] = Field(default_factory=list, description="Module entries: what each load_inline extension "
                              "was loaded from (the verified build, one built before the run, or compiled here).")


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


def current_phase() -> str:
    """``backward`` while the autograd engine runs a backward pass on this thread, else ``forward``."""
    return "backward" if _graph_task_id() >= 0 else "forward"


class Live:
    """One dispatched entry: its validated keys, its rule guard, its callable, its counters."""

    def __init__(self, entry: PackEntry, impl: Any):
        self.entry = entry
        self.keys = pattern_keys(entry.pattern)
        self.key = self.keys[0]
        rule = entry.shape_rule
        self.guard = RuleGuard(self.key, rule) if rule is not None and rule.checked else None
        self.impl = impl
        self.hits: collections.Counter[str] = collections.Counter()
        self.raised: collections.Counter[str] = collections.Counter()

    def count(self, phase: str) -> None:
        self.hits[phase] += 1

    def why_not(self, key: tuple) -> str:
        """Why the call of ``key`` does not reach this entry."""
        reason = self.guard.why_not(key) if self.guard is not None else None
        return reason or difference(key, self.key)


class Guarded:
    """The entries of one operator or one module path, keyed by validated call key."""

    def __init__(self, lives: list[Live], runtime: Any = None):
        self.runtime = runtime
        self.lives: list[Live] = []
        self.by_key: dict[tuple, Live] = {}
        self.ruled: list[Live] = []
        self.admitted = 0
        self.misses: collections.Counter[tuple] = collections.Counter()
        for live in lives:
            self.add(live)

    def add(self, live: Live) -> None:
        self.lives.append(live)
        for key in live.keys:
            self.by_key.setdefault(key, live)
        if live.guard is not None:
            self.ruled.append(live)

    @property
    def guards_training(self) -> bool:
        """Whether live keys carry the model's training flag (entries that recorded one)."""
        return any(x.entry.pattern.training is not None for x in self.lives)

    def lookup(self, key: tuple) -> Live | None:
        """The entry the call of ``key`` goes to: an exact key, else the first whose rule admits it."""
        live = self.by_key.get(key)
        if live is not None or not self.ruled:
            return live
        for candidate in self.ruled:
            if candidate.guard is not None and candidate.guard.why_not(key) is None:
                if self.admitted < MAX_ADMITTED_KEYS:
                    self.by_key[key] = candidate
                    self.admitted += 1
                return candidate
        return None

    def call(self, key: tuple, run: Callable[[Live], Any], eager: Callable[[], Any]) -> Any:
        live = self.lookup(key)
        if live is None:
            self.misses[key] += 1
            return eager()
        return self.run(live, run, eager)

    def run(self, live: Live, run: Callable[[Live], Any], eager: Callable[[], Any]) -> Any:
        """Run ``live``'s kernel; eager (and the exception counted) if it raises."""
        try:
            out = run(live)
        except Exception as e:  # noqa: BLE001 - a failing pack kernel falls back to eager and is reported
            live.raised[_first_line(e)] += 1
            return eager()
        live.count(current_phase())
        return out

    def fallbacks(self) -> dict[int, collections.Counter[str]]:
        """id(live) -> reasons of the calls that did not reach it (misses attributed to the closest)."""
        out: dict[int, collections.Counter[str]] = {id(x): collections.Counter(x.raised) for x in self.lives}
        for key, n in self.misses.items():
            closest = min(self.lives, key=lambda x: distance(key, x.key))
            out[id(closest)][closest.why_not(key)] += n
        return out


class OpTable(Guarded):
    """The entries of one operator (see :mod:`modulelens.dispatch.interceptors`)."""

    def __init__(self, op: torch._ops.OpOverload, lives: list[Live], runtime: Any):
        super().__init__(lives, runtime)
        self.op = op


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
        self.inside_module = 0  # > 0 while a module entry's own forward (or marked backward) runs
        self.training: bool | None = None  # the training flag of the model running (op entries guard it)
        self.skipped: dict[int, str] = {}
        self.tables: dict[Any, OpTable] = {}
        self.modules: dict[tuple[str, str], tuple[Guarded, ModuleReplacement]] = {}
        self.module_sources: set[str] = set()  # modules the module entries' sources were loaded as
        self.patched: list[tuple[torch.nn.Module, Any]] = []
        interceptor_cls = LibraryInterceptor if mechanism == "library" else ModeInterceptor
        by_op: dict[Any, list[Live]] = {}
        for i, entry in enumerate(pack.content.entries):
            reason = entry.skip_reason()
            if reason is None:
                try:
                    if entry.kind == "op":
                        op = _resolve(entry.op or "")
                        reason = interceptor_cls.unsupported(op)
                        if reason is None:
                            by_op.setdefault(op, []).append(Live(entry, _build_kernel(entry)))
                    else:
                        self._add_module_entry(entry)
                except Exception as e:  # noqa: BLE001 - an entry that cannot be built here is reported, not fatal
                    reason = f"cannot be built here: {type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
            if reason is not None:
                self.skipped[i] = reason
        self.tables = {op: OpTable(op, lives, self) for op, lives in by_op.items()}
        self.has_backward_op_entries = any(x.entry.phase == "backward" for t in self.tables.values() for x in t.lives)
        self.interceptor = interceptor_cls(self.tables)
        self.installed = False
        self._bridges: list[Any] = []  # per activation: the inference bridge it entered, or None

    def _add_module_entry(self, entry: PackEntry) -> None:
        from modulelens.dispatch.builds import verified_load_inline
        from modulelens.kernels import load_class

        with verified_load_inline(entry):  # the builds validation verified, not a silent compile
            cls = load_class(entry.source, entry.entry)
        tensors: dict[str, torch.Tensor] = {}
        if entry.init and entry.init.tensors_b64:
            from safetensors.torch import load

            tensors = load(base64.b64decode(entry.init.tensors_b64))
        where = (entry.class_path or "", entry.module_path or "")
        guarded = self.modules[where][0] if where in self.modules else Guarded([], self)
        guarded.add(Live(entry, None))
        self.modules[where] = (guarded, ModuleReplacement(cls, entry, tensors))
        self.module_sources.add(cls.__module__)

    # -- operators ----------------------------------------------------------------------------
    def install(self) -> None:
        """Register the library kernels (a no-op for ``mode``, which is entered on activation)."""
        if not self.installed and self.tables and self.mechanism == "library":
            self.interceptor.install()
        self.installed = True

    def activate(self) -> None:
        """Start dispatching (nests): entered by use_pack's block, an applied model's forward, and
        a backward pass through an applied model's outputs."""
        self.depth += 1
        if self.depth == 1 and self.tables and self.mechanism == "mode" and not self.paused:
            self.interceptor.install()
        library = self.tables and self.mechanism == "library"
        self._bridges.append(enter_bridge_if_inference() if library else None)

    def op_dispatch_on(self) -> bool:
        """Whether operator calls are dispatched now: active, not paused, not inside a module
        entry's forward or its own backward."""
        if self.depth <= 0 or self.paused or self.inside_module:
            return False
        if self.module_sources and _graph_task_id() >= 0:
            node = torch._C._current_autograd_node()
            if node is not None and any(own_backward_node(node, m) for m in self.module_sources):
                return False
        return True

    def enter_module(self) -> None:
        self.inside_module += 1

    def leave_module(self) -> None:
        self.inside_module = max(0, self.inside_module - 1)

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
        bridge = self._bridges.pop() if self._bridges else None
        if bridge is not None:
            bridge.__exit__(None, None, None)
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
        from modulelens.capture import class_path

        n = 0
        for name, module in model.named_modules():
            path = ".".join(p for p in (root_path, name) if p)
            found = self.modules.get((class_path(module), path))
            if found is None or getattr(module.forward, "__modulelens_pack__", False):
                continue
            self.patched.append((module, module.__dict__.get("forward")))
            module.forward = guarded_forward(self, module, *found)
            n += 1
        return n

    # -- report -------------------------------------------------------------------------------
    def report(self) -> DispatchReport:
        lives: dict[int, tuple[Live, collections.Counter[str]]] = {}
        for guarded in [*self.tables.values(), *(g for g, _ in self.modules.values())]:
            reasons = guarded.fallbacks()
            for live in guarded.lives:
                lives[id(live.entry)] = (live, reasons[id(live)])
        out = DispatchReport(pack=self.pack.path, sha256=self.pack.sha256, mechanism=self.mechanism,
                             environment_notes=self.pack.environment_notes)
        for i, entry in enumerate(self.pack.content.entries):
            target = entry.op if entry.kind == "op" else f"{entry.class_path} at {entry.module_path}"
            rule = entry.shape_rule
            rep = EntryReport(candidate_id=entry.candidate_id, kind=entry.kind, target=target or "",
                              dispatched=i not in self.skipped, skip_reason=self.skipped.get(i),
                              speedup_vs_eager=entry.speedup_vs_eager,
                              shape_rule=rule.summary() if rule is not None and rule.checked else None,
                              builds=build_notes(entry.candidate_id) if entry.kind == "module" else [])
            if id(entry) in lives:
                live, reasons = lives[id(entry)]
                rep.hits, rep.hits_by_phase = sum(live.hits.values()), dict(live.hits)
                rep.fallbacks = sum(reasons.values())
                rep.fallback_reasons = dict(reasons.most_common())
            out.entries.append(rep)
        out.hits = sum(e.hits for e in out.entries)
        out.fallbacks = sum(e.fallbacks for e in out.entries)
        return out


def _resolve(op_name: str) -> torch._ops.OpOverload:
    from modulelens.ops import resolve_op

    return resolve_op(op_name)


def _build_kernel(entry: PackEntry) -> Callable[..., Any]:
    from modulelens.kernels import default_build_dir, get_backend

    backend = get_backend(entry.backend)
    status = backend.status()
    if not status.can_run:
        raise RuntimeError(f"{entry.backend} kernels cannot run here: {status.why}")
    return backend.load(entry.source, entry.entry, default_build_dir())
