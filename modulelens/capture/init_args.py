"""Record the constructor arguments of every ``nn.Module`` built while recording is on.

``__init__`` of every existing ``nn.Module`` subclass is wrapped, and ``nn.Module.__init_subclass__``
wraps classes defined later (in a script's ``__main__`` or imported after installation). The
outermost ``__init__`` call of an instance wins, so a subclass calling ``super().__init__(...)``
records the arguments it was itself built with. Arguments are kept as live objects and encoded
only for the module that gets captured.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn

from modulelens.capture.spec import ModuleSpec
from modulelens.capture.values import Encoder, class_path

_state = threading.local()
_active = False
_records: dict[int, tuple[weakref.ref, InitRecord]] = {}
_patched: dict[type, tuple[Any, Any]] = {}  # class -> (its own __init__, our wrapper of it)
_had_init_subclass = False
_orig_init_subclass: Any = None


@dataclass
class InitRecord:
    cls: type
    args: list[Any] = field(default_factory=list)  # positional-only and *args
    kwargs: dict[str, Any] = field(default_factory=dict)
    bind_error: str | None = None


def record_of(module: nn.Module) -> InitRecord | None:
    entry = _records.get(id(module))
    if entry is not None and entry[0]() is module:
        return entry[1]
    return None


def construction_spec(module: nn.Module, path: str, encoder: Encoder) -> ModuleSpec | None:
    """The recorded construction of ``module`` encoded as its arguments are *now* (nested modules
    recursively, through ``encoder.module_spec``); None when its construction was not recorded.

    Call it when the captured call happens: libraries change config objects after building a
    module, and the call must be rebuilt with the objects as they were then."""
    rec = record_of(module)
    if rec is None:
        return None
    return ModuleSpec(
        cls=class_path(rec.cls),
        args=[encoder.encode(a, f"{path}.args.{i}") for i, a in enumerate(rec.args)],
        kwargs={k: encoder.encode(v, f"{path}.{k}") for k, v in rec.kwargs.items()},
        bind_error=rec.bind_error or None,
    )


_PLAIN = (bool, int, float, str, type(None))


def plain_attributes(module: nn.Module) -> dict[str, dict[str, Any]]:
    """Attributes of plain value (None, bool, int, finite float, str) that ``module`` and each of
    its submodules hold now, by submodule name ("" for ``module``), ``training`` excepted.

    A rebuilt module starts from its constructor; these restore what was changed afterwards
    (``layer.is_causal = False``, flags set by a library after building)."""
    out: dict[str, dict[str, Any]] = {}
    for name, sub in module.named_modules(remove_duplicate=False):
        attrs = {k: v for k, v in vars(sub).items()
                 if type(v) in _PLAIN and k != "training" and not (type(v) is float and v != v)}
        if attrs:
            out[name] = attrs
    return out


def restore_plain_attributes(module: nn.Module, attributes: dict[str, dict[str, Any]]) -> list[str]:
    """Set the recorded plain attributes on a rebuilt module; returns the ``name.attr`` changed."""
    subs = dict(module.named_modules(remove_duplicate=False))
    changed = []
    for name, attrs in attributes.items():
        sub = subs.get(name)
        if sub is None:
            continue
        for key, value in attrs.items():
            if sub.__dict__.get(key, _MISSING) != value or type(sub.__dict__.get(key)) is not type(value):
                object.__setattr__(sub, key, value)
                changed.append(f"{name}.{key}" if name else key)
    return changed


_MISSING = object()


def _split_bound(sig: inspect.Signature, args: tuple, kwargs: dict) -> tuple[list[Any], dict[str, Any], str | None]:
    try:
        bound = sig.bind(None, *args, **kwargs)
    except TypeError as e:
        return list(args), dict(kwargs), str(e)
    pos: list[Any] = []
    named: dict[str, Any] = {}
    params = list(sig.parameters.values())[1:]  # drop self
    for p in params:
        if p.name not in bound.arguments:
            continue
        v = bound.arguments[p.name]
        if p.kind is p.POSITIONAL_ONLY:
            pos.append(v)
        elif p.kind is p.VAR_POSITIONAL:
            pos.extend(v)
        elif p.kind is p.VAR_KEYWORD:
            named.update(v)
        elif p.kind is p.POSITIONAL_OR_KEYWORD and any(q.kind is q.POSITIONAL_ONLY for q in params) and pos:
            pos.append(v)
        else:
            named[p.name] = v
    return pos, named, None


_built: list[weakref.ref] = []
"""Modules whose construction was outermost (not inside another module's ``__init__``), latest last."""


def _remember_built(module: nn.Module) -> None:
    try:
        _built.append(weakref.ref(module))
    except TypeError:
        pass
    _built[:] = [r for r in _built if r() is not None][-64:]


def built_within(module: nn.Module) -> nn.Module | None:
    """The latest outermost-built module that holds ``module`` (``module`` itself when it was built
    outermost), None when there is none: a model's layer called alone is named within its model."""
    for ref in reversed(_built):
        root = ref()
        if root is not None and root is not module and any(m is module for m in root.modules()):
            return root
    return None


def _forget(key: int) -> None:
    _records.pop(key, None)


def _wrap(cls: type) -> None:
    init = cls.__dict__.get("__init__")
    if init is None or getattr(init, "__modulelens_wrapped__", False) or cls in _patched:
        return
    try:
        sig = inspect.signature(init)
    except (TypeError, ValueError):
        sig = None

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        outermost = _active and getattr(_state, "building", 0) == 0
        if outermost:
            _state.building = 1
            try:
                record(self, args, kwargs)
                return init(self, *args, **kwargs)
            finally:
                _state.building = 0
                _remember_built(self)
        record(self, args, kwargs)
        return init(self, *args, **kwargs)

    def record(self, args, kwargs):
        if _active and record_of(self) is None:
            if sig is not None:
                pos, named, err = _split_bound(sig, args, kwargs)
            else:
                pos, named, err = list(args), dict(kwargs), "signature not inspectable"
            key = id(self)
            try:
                ref = weakref.ref(self, lambda _r, key=key: _forget(key))
            except TypeError:
                ref = None
            if ref is not None:
                _records[key] = (ref, InitRecord(type(self), pos, named, err))

    wrapper.__modulelens_wrapped__ = True  # type: ignore[attr-defined]
    _patched[cls] = (init, wrapper)
    type.__setattr__(cls, "__init__", wrapper)


def _all_subclasses(cls: type) -> list[type]:
    out, todo = [], [cls]
    while todo:
        c = todo.pop()
        out.append(c)
        try:
            todo.extend(c.__subclasses__())
        except TypeError:
            pass
    return out


def _init_subclass_hook(cls, **kwargs):
    if _orig_init_subclass is not None:
        _orig_init_subclass.__get__(None, cls)(**kwargs)
    else:
        super(nn.Module, cls).__init_subclass__(**kwargs)
    _wrap(cls)


def install() -> None:
    """Start recording (idempotent)."""
    global _active, _had_init_subclass, _orig_init_subclass
    if _active:
        return
    for c in _all_subclasses(nn.Module):
        _wrap(c)
    _had_init_subclass = "__init_subclass__" in nn.Module.__dict__
    _orig_init_subclass = nn.Module.__dict__.get("__init_subclass__")
    nn.Module.__init_subclass__ = classmethod(_init_subclass_hook)  # type: ignore[assignment]
    _active = True


def uninstall() -> None:
    """Stop recording and restore the original ``__init__`` of the classes that existed before.

    Classes defined while recording keep an inert wrapper (they cannot be unwrapped safely while
    instances of them may still be under construction), and so do classes whose ``__init__`` was
    replaced again after ours was installed (a class decorator wrapping it): restoring the original
    would drop the decorator's work."""
    global _active
    if not _active:
        return
    _active = False
    for cls, (init, wrapper) in list(_patched.items()):
        if cls.__dict__.get("__init__") is wrapper:
            type.__setattr__(cls, "__init__", init)
        # else a decorator replaced the wrapper after the class was defined (transformers'
        # ``use_experts_implementation`` wraps ``__init__`` once more): its replacement stays, and the
        # inert wrapper it calls stays with it
    _patched.clear()
    if _had_init_subclass:
        nn.Module.__init_subclass__ = _orig_init_subclass  # type: ignore[assignment]
    else:
        try:
            del nn.Module.__init_subclass__
        except AttributeError:
            pass


class recording:
    """Context manager: ``with recording(): model = build()``."""

    def __enter__(self):
        self._was_active = _active
        install()
        return self

    def __exit__(self, *exc):
        if not self._was_active:
            uninstall()
        return False
