"""Standalone KernelBench-format repro files of a capture.

The file defines ``Model``, ``get_inputs`` and ``get_init_inputs`` and needs only torch and
safetensors. Two flavours, tried in this order:

* ``source``: the source of the module's defining file (its definitions only) is inlined, and
  ``Model`` builds the module from the recorded constructor arguments: readable code an agent can
  optimise. Possible when that file imports nothing but torch, numpy, safetensors and the standard
  library.
* ``export``: ``Model`` wraps the saved ``torch.export`` program.

Captured weights, inputs, expected outputs and the RNG state sit in a folder next to the file.
Running the file checks the module against the captured outputs (:func:`check_repro`).
"""

from __future__ import annotations

import ast
import inspect
import io
import math
import re
import shutil
import subprocess
import sys
import tempfile
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modulelens.capture.manifest import CaptureManifest, capture_manifest
from modulelens.capture.sources import definitions_source
from modulelens.capture.spec import ModuleSpec, SpecVisitor, TensorSpec, ValueKind
from modulelens.capture.spec_walk import referenced_modules
from modulelens.errors import ModuleLensError
from modulelens.repo import Artifact, require_trusted

FLAVORS = ("source", "export")
DATA_FILES = ("inputs.safetensors", "init.safetensors", "outputs.safetensors", "state.safetensors",
              "rng.safetensors", "weights.safetensors")
VERIFY_TOLERANCE = 1e-5

_ALLOWED_TOP = {"torch", "numpy", "safetensors", "math", "__future__"} | set(getattr(sys, "stdlib_module_names", ()))


class NotStandalone(Exception):
    """Why one flavour of repro cannot be written for a capture."""


def _top(module: str) -> str:
    return module.split(".", 1)[0]


class ReproRenderer(SpecVisitor[str]):
    """Renders value specs as Python expressions for the generated file. Classes of modules in
    ``inline`` are referred to by their bare name (their definitions are inlined); others must come
    from torch, numpy, safetensors or the standard library and are collected in ``imports``."""

    def __init__(self, inline: set[str]):
        self.inline = inline
        self.renames: dict[str, str] = {}  # top-level names of inlined code renamed in the file
        self.imports: set[str] = set()

    def class_expr(self, path: str) -> str:
        module, _, qual = path.partition(":")
        if module in self.inline:
            first, dot, rest = qual.partition(".")
            return self.renames.get(first, first) + dot + rest
        if _top(module) not in _ALLOWED_TOP or "<locals>" in qual:
            raise NotStandalone(f"it needs {module}.{qual} from outside torch and the standard library")
        self.imports.add(module)
        return f"{module}.{qual}"

    def scalar(self, value: Any) -> str:
        return repr(value)

    def tensor(self, spec: TensorSpec) -> str:
        if spec.stored:
            expr = f"_DATA[{spec.key!r}]"
        else:
            stats = spec.stats.to_json() if spec.stats is not None else {}
            expr = f"_synthesize({spec.shape!r}, torch.{spec.dtype}, {stats!r})"
        if spec.storage is not None and spec.stride is not None:  # memory shared as in the run
            slot = spec.storage
            return (f"_shared({expr}, {slot.id!r}, {spec.shape!r}, {spec.stride!r}, {slot.offset!r}, {slot.span!r}, "
                    f"{bool(spec.requires_grad)!r})")
        if not spec.requires_grad:
            return expr
        # an activation in the run (not a leaf) is given as one: in-place operations on it are allowed
        return expr + (".requires_grad_(True)" if spec.leaf else ".requires_grad_(True).clone()")

    def nonfinite_float(self, text: str) -> str:
        return f"float({text!r})"

    def dtype(self, name: str) -> str:
        return f"torch.{name}"

    def device(self, name: str) -> str:
        return f"torch.device({name!r})"

    def torch_constant(self, name: str) -> str:
        return f"torch.{name}"

    def size(self, dims: list[int]) -> str:
        return f"torch.Size({dims!r})"

    def enum(self, cls: str, member: str) -> str:
        return f"{self.class_expr(cls)}.{member}"

    def type_ref(self, cls: str) -> str:
        return self.class_expr(cls)

    def callable_ref(self, path: str) -> str:
        return self.class_expr(path)

    def complex_number(self, real: float, imag: float) -> str:
        return f"complex({real!r}, {imag!r})"

    def slice(self, start: Any, stop: Any, step: Any) -> str:
        return f"slice({', '.join(self.visit(v) for v in (start, stop, step))})"

    def ellipsis(self) -> str:
        return "..."

    def number(self, cls: str, value: int | float) -> str:
        return repr(value)

    def sequence(self, kind: ValueKind, items: list[Any], cls: str | None) -> str:
        text = ", ".join(self.visit(v) for v in items)
        lit = f"[{text}]" if kind == ValueKind.LIST else f"({text}{',' if len(items) == 1 else ''})"
        return f"{self.class_expr(cls)}({lit})" if cls is not None else lit

    def mapping(self, items: list[tuple[Any, Any]], cls: str | None) -> str:
        lit = "{" + ", ".join(f"{self.visit(k)}: {self.visit(v)}" for k, v in items) + "}"
        return f"{self.class_expr(cls)}({lit})" if cls is not None else lit

    def default_mapping(self, items: list[tuple[Any, Any]], factory: Any, cls: str | None) -> str:
        lit = "{" + ", ".join(f"{self.visit(k)}: {self.visit(v)}" for k, v in items) + "}"
        return f"{self.class_expr(cls or 'collections:defaultdict')}({self.visit(factory)}, {lit})"

    def set_value(self, items: list[Any], frozen: bool, cls: str | None) -> str:
        lit = "[" + ", ".join(self.visit(v) for v in items) + "]"
        return f"{self.class_expr(cls) if cls is not None else 'frozenset' if frozen else 'set'}({lit})"

    def range_value(self, start: int, stop: int, step: int) -> str:
        return f"range({start!r}, {stop!r}, {step!r})"

    def path(self, cls: str, text: str) -> str:
        return f"{self.class_expr(cls)}({text!r})"

    def datetime_value(self, cls: str, iso: str) -> str:
        return f"{self.class_expr(cls)}.fromisoformat({iso!r})"

    def timedelta_value(self, days: int, seconds: int, microseconds: int) -> str:
        self.imports.add("datetime")
        return f"datetime.timedelta(days={days!r}, seconds={seconds!r}, microseconds={microseconds!r})"

    def record(self, kind: ValueKind, cls: str, fields: dict[str, Any]) -> str:
        if kind == ValueKind.NAMEDTUPLE:
            return f"{self.class_expr(cls)}({', '.join(f'{k}={self.visit(v)}' for k, v in fields.items())})"
        return f"_dataclass({self.class_expr(cls)}, {self._state(fields)})"

    def object_state(self, cls: str, state: dict[str, Any]) -> str:
        return f"_restore({self.class_expr(cls)}, {self._state(state)})"

    def _state(self, state: dict[str, Any]) -> str:
        return "{" + ", ".join(f"{k!r}: {self.visit(v)}" for k, v in state.items()) + "}"

    def module(self, spec: ModuleSpec) -> str:
        parts = [self.visit(a) for a in spec.args] + [f"{k}={self.visit(v)}" for k, v in spec.kwargs.items()]
        return f"{self.class_expr(spec.cls)}({', '.join(parts)})"

    def unrecorded(self, type_path: str, text: str, why: str, at: str = "") -> str:
        raise NotStandalone(f"a value of type {type_path} was not recorded" + (f" ({at})" if at else ""))

    def unknown_kind(self, kind: str, spec: dict[str, Any]) -> str:
        raise NotStandalone(f"a value of type {kind} was not recorded")


class _MappingKeys(SpecVisitor[list[Any]]):
    """The key specs of a dict spec, in order (nothing for other specs)."""

    def mapping(self, items: list[tuple[Any, Any]], cls: str | None) -> list[Any]:
        return [k for k, _ in items]

    def scalar(self, value: Any) -> list[Any]:
        return []

    def unsupported(self, kind: ValueKind, spec: dict[str, Any]) -> list[Any]:
        return []


def _user_modules(spec: ModuleSpec) -> set[str]:
    """Modules of the classes a construction refers to, other than torch and the standard library."""
    return {m for m in referenced_modules(spec.to_json()) if _top(m) not in _ALLOWED_TOP}


def _module_source(art: Artifact, manifest: CaptureManifest, module: str) -> str:
    stored = manifest.sources.get(module)
    if stored is not None:
        return art.file(stored.file).read_text()
    from modulelens.capture.replay import LoadedCapture

    try:
        mod = LoadedCapture(art).resolver.module(module)
        return inspect.getsource(mod)
    except Exception as e:  # noqa: BLE001
        raise NotStandalone(f"the source of {module} is not available ({e})") from e


def _check_imports(source: str, module: str) -> None:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.level or _top(node.module or "") not in _ALLOWED_TOP):
            raise NotStandalone(f"{module} imports {'.' * node.level}{node.module or ''}, which is not torch or the standard library")
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _top(alias.name) not in _ALLOWED_TOP:
                    raise NotStandalone(f"{module} imports {alias.name}, which is not torch or the standard library")


_HEADER = '''"""Standalone repro of capture {ref} ({class_path} at {module_path!r}), written by modulelens.

KernelBench format: Model, get_inputs(), get_init_inputs(). Needs only torch and safetensors{needs}.
Captured data lives in {data_name}/. Run this file to check Model against the captured outputs
and the state the captured call changed; it exits with status 1 when they differ.
"""
{future}import contextlib
import math
import sys
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import load_file
{imports}
_HERE = Path(__file__).resolve().parent / {data_name!r}
# cloned: safetensors may hand out tensors at any byte offset, and BLAS kernels can round differently
# on memory that is not aligned as torch's allocator aligns it (the captured call ran on such memory)
_DATA = {{k: v.clone() for f in ("inputs.safetensors", "init.safetensors") if (_HERE / f).exists()
         for k, v in load_file(str(_HERE / f)).items()}}


def _synthesize(shape, dtype, stats):
    """Random data like a tensor that was stored shape-only (normal, clipped, zeros kept)."""
    if dtype == torch.bool:
        return torch.rand(shape) >= stats.get("zero_fraction", 0.0)
    lo, hi = stats.get("min", 0.0), stats.get("max", 1.0)
    if not dtype.is_floating_point:
        return torch.randint(int(lo), int(hi) + 1, shape).to(dtype)
    x = (torch.randn(shape, dtype=torch.float64) * stats.get("std", 1.0) + stats.get("mean", 0.0)).clamp(lo, hi)
    return x.to(dtype)


_STORAGES = {{}}  # storage id -> the buffer its inputs share (made anew by each get_inputs)


def _shared(values, storage, shape, stride, offset, span, grad):
    """An input that shares memory with others (or within itself, a broadcast view) as in the run:
    the strided view at ``offset`` of the buffer of ``storage``, its values written through it."""
    work = _STORAGES.get(storage)
    if work is None:
        work = torch.zeros(span, dtype=values.dtype)
        if grad and work.is_floating_point():
            work = work.requires_grad_(True).clone()
        _STORAGES[storage] = work
    with torch.no_grad():
        where = torch.arange(span).as_strided(shape, stride, offset).reshape(-1)
        work.detach().index_put_((where,), values.reshape(-1))
    view = (work if grad and work.requires_grad else work.detach()).as_strided(shape, stride, offset)
    if grad and work.requires_grad:
        view.retain_grad()
    return view


def _restore(cls, state):
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj


def _program(path):
    """A saved torch.export program as a module; parameters saved without data (on the meta device)
    get storage, which the captured weights then fill."""
    module = torch.export.load(str(path)).module()
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None and p.is_meta:
                sub._parameters[name] = nn.Parameter(torch.empty_like(p, device="cpu"), p.requires_grad)
        for name, b in list(sub._buffers.items()):
            if b is not None and b.is_meta:
                sub._buffers[name] = torch.empty_like(b, device="cpu")
    return module


def _dataclass(cls, state):
    """A dataclass built from its init fields, then every recorded attribute set as recorded."""
    import dataclasses

    obj = cls(**{{f.name: state[f.name] for f in dataclasses.fields(cls) if f.init and f.name in state}})
    for k, v in state.items():
        object.__setattr__(obj, k, v)
    return obj

'''

_FOOTER = '''

TRAINING = {training!r}
GRAD_ENABLED = {grad_enabled!r}
AUTOCAST = {autocast!r}
STATE_KEYS = {state_keys!r}
{model}

def get_init_inputs():
    return []


def _keyed(x, path, out):
    """The tensors of a value by the keys modulelens gives them (output.0, args.1.cache.keys)."""
    if isinstance(x, torch.Tensor):
        out[path] = x
    elif isinstance(x, dict):
        for k, v in x.items():
            _keyed(v, f"{{path}}.{{k}}", out)
    elif isinstance(x, tuple) and hasattr(x, "_fields"):
        for k in x._fields:
            _keyed(getattr(x, k), f"{{path}}.{{k}}", out)
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            _keyed(v, f"{{path}}.{{i}}", out)
    elif hasattr(x, "__dict__") and not isinstance(x, (type, nn.Module)):
        for k, v in vars(x).items():
            _keyed(v, f"{{path}}.{{k}}", out)
    return out


def _check(got, expected):
    """The largest absolute difference (chunk by chunk) and the keys that are missing."""
    worst, missing, step = 0.0, [k for k in expected if k not in got], 1 << 22
    for key, want in expected.items():
        if key not in got:
            continue
        a, e = got[key].detach().reshape(-1), want.reshape(-1)
        if a.shape != e.shape:
            return math.inf, missing + [key]
        for i in range(0, e.numel(), step):
            x, y = a[i:i + step].double(), e[i:i + step].double()
            d = (x - y).abs().masked_fill(torch.isnan(x) & torch.isnan(y), 0)
            worst = max(worst, torch.nan_to_num(d, nan=math.inf).max().item())
    return worst, missing


def _stored(name):
    path = _HERE / name
    return load_file(str(path)) if path.exists() else {{}}


if __name__ == "__main__":
    model = Model(*get_init_inputs())
    inputs = get_inputs()
    rng = _HERE / "rng.safetensors"
    if rng.exists():
        torch.random.set_rng_state(load_file(str(rng))["cpu"])
    with torch.set_grad_enabled(GRAD_ENABLED), contextlib.ExitStack() as regions:
        for device, dtype in AUTOCAST.items():  # the torch.autocast regions the call ran in
            regions.enter_context(torch.autocast(device, dtype=getattr(torch, dtype)))
        out = model(*inputs)
    got = model.keyed_results(out, inputs)
    expected = _stored("outputs.safetensors")
    expected.update({{k: v for k, v in _stored("state.safetensors").items() if k in STATE_KEYS}})
    worst, missing = _check(got, expected)
    print(f"max_abs_error={{worst!r}} compared={{len(expected)}} missing={{','.join(missing)}}")
    if missing or not worst <= {tolerance!r}:
        sys.exit("the repro does not reproduce the capture: "
                 + (f"missing {{', '.join(missing[:3])}}; " if missing else "") + f"max abs error {{worst!r}}")
'''

_CALL_CLASS = '''KWARG_NAMES = {kwarg_names!r}
ATTRIBUTES = {attributes!r}


class Model(nn.Module):
    """The captured module with the captured weights. forward(*inputs): the captured positional
    inputs, then the keyword inputs named in KWARG_NAMES, in that order."""

    def __init__(self):
        super().__init__()
{build}

    def forward(self, *inputs):
        n = len(inputs) - len(KWARG_NAMES)
        return self.inner(*inputs[:n], **dict(zip(KWARG_NAMES, inputs[n:])))

    def keyed_results(self, out, inputs):
        """Output tensors by key, then the inputs and buffers as they are after the call."""
        n = len(inputs) - len(KWARG_NAMES)
        found = _keyed(out, "output", {{}})
        _keyed(list(inputs[:n]), "args", found)
        _keyed(dict(zip(KWARG_NAMES, inputs[n:])), "kwargs", found)
        found.update({{"module." + k: b for k, b in self.inner.named_buffers()}})
        return found


def get_inputs():
    _STORAGES.clear()
    args = {args}
    kwargs = {kwargs}
    return list(args) + [kwargs[k] for k in KWARG_NAMES]

'''

_LEAVES_CLASS = '''INPUT_KEYS = {input_keys!r}
RETURNED_KEYS = {returned_keys!r}


class Model(nn.Module):
    """The captured call as a torch.export program of tensors only: forward(*inputs) takes the
    captured input tensors in the order of INPUT_KEYS (objects around them, such as caches, are
    rebuilt inside) and returns the tensors of RETURNED_KEYS (outputs, then inputs it changed)."""

    def __init__(self):
        super().__init__()
        self.inner = _program(_HERE / "program.pt2")
        self.inner.load_state_dict({{"inner." + k: v for k, v in _stored("weights.safetensors").items()}}, strict=False)

    def forward(self, *inputs):
        return self.inner(*inputs)

    def keyed_results(self, out, inputs):
        found = dict(zip(RETURNED_KEYS, out))
        found.update({{"module." + k[len("inner."):]: b for k, b in self.inner.named_buffers() if k.startswith("inner.")}})
        return found


def get_inputs():
    _STORAGES.clear()
    return [{leaves}]

'''

_CAPTURED_SUFFIX = "_captured"
"""Appended to top-level names of inlined code that the repro defines itself (``Model``)."""

_REPRO_NAMES = ("Model", "get_inputs", "get_init_inputs")


def rename_names(source: str, renames: dict[str, str]) -> str:
    """``source`` with every identifier in ``renames`` replaced (not attribute names after a dot),
    comments and layout kept."""
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, int, str]] = []
    prev: tokenize.TokenInfo | None = None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.string in renames and not (prev and prev.string == "."):
            edits.append((tok.start[0], tok.start[1], tok.end[1], renames[tok.string]))
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            prev = tok
    for row, start, end, name in reversed(edits):
        line = lines[row - 1]
        lines[row - 1] = line[:start] + name + line[end:]
    return "".join(lines)


def _source_build(art: Artifact, manifest: CaptureManifest, r: ReproRenderer) -> tuple[str, str]:
    if "source" not in manifest.strategies or manifest.init is None:
        raise NotStandalone("the capture has no recorded construction (no source strategy)")
    users = _user_modules(manifest.init)
    if len(users) > 1:
        raise NotStandalone(f"the module's code spans several files ({', '.join(sorted(users))})")
    body = ""
    if users:
        (module,) = users
        source = definitions_source(_module_source(art, manifest, module), module)
        _check_imports(source, module)
        defined = {n.name for n in ast.parse(source).body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
        r.renames = {name: name + _CAPTURED_SUFFIX for name in _REPRO_NAMES if name in defined}
        source = rename_names(source, r.renames)
        body = f"# ---- definitions from {module} ----\n{source}\n# ---- end of {module} ----\n"
        r.inline = {module}
    build = (f"        self.inner = {r.module(manifest.init)}\n"
             "        if any(t.is_meta for t in [*self.inner.parameters(), *self.inner.buffers()]):\n"
             "            self.inner.to_empty(device='cpu')  # built on meta: the captured weights fill it\n"
             "        for name, attrs in ATTRIBUTES.items():\n"
             "            sub = self.inner.get_submodule(name)\n"
             "            for key, value in attrs.items():\n"
             "                object.__setattr__(sub, key, value)\n"
             "        self.inner.load_state_dict(_stored('weights.safetensors'), strict=False)\n"
             "        self.inner.train(TRAINING)")
    return body, build


def _call_class(manifest: CaptureManifest, build: str, r: ReproRenderer) -> str:
    return _CALL_CLASS.format(
        kwarg_names=_MappingKeys().visit(manifest.inputs.kwargs), attributes=manifest.attributes, build=build,
        args=r.visit(manifest.inputs.args), kwargs=r.visit(manifest.inputs.kwargs))


def _export_class(manifest: CaptureManifest, r: ReproRenderer) -> str:
    if "export" not in manifest.strategies:
        raise NotStandalone("the capture has no torch.export program")
    info = manifest.export
    if info.calling == "call":
        # A program of the module itself (earlier captures) keeps the train/eval behaviour it was exported with.
        build = ("        self.inner = _program(_HERE / 'program.pt2')\n"
                 "        self.inner.load_state_dict(_stored('weights.safetensors'), strict=False)")
        return _call_class(manifest, build, r)
    specs = {t.key: t for t in manifest.inputs.tensor_leaves()}
    leaves = ", ".join(r.tensor(specs[k]) for k in info.input_keys)
    for modules in info.custom_ops.values():  # they register the program's custom operators
        r.imports.update(modules)
    return _LEAVES_CLASS.format(input_keys=info.input_keys, returned_keys=info.returned_keys, leaves=leaves)


@dataclass(frozen=True)
class _Rendered:
    flavor: str
    body: str
    model: str
    imports: set[str]


def _render(art: Artifact, manifest: CaptureManifest, flavors: list[str]) -> tuple[_Rendered, list[str]]:
    """The first flavour that can be written, and why the ones before it could not."""
    skipped: list[str] = []
    for flavor in flavors:
        r = ReproRenderer(set())
        try:
            if flavor == "source":
                body, build = _source_build(art, manifest, r)
                model = _call_class(manifest, build, r)
            else:
                body, model = "", _export_class(manifest, r)
            return _Rendered(flavor, body, model, r.imports), skipped
        except NotStandalone as e:
            skipped.append(f"{flavor}: {e}")
    raise ModuleLensError(f"cannot write a standalone repro of {art.ref}: " + "; ".join(skipped),
                          "capture with export enabled, or keep the model's code importable with only torch")


@dataclass
class ReproFile:
    """A written repro: the file, its data folder, the flavour used and why others were not."""

    path: Path
    data_dir: Path
    flavor: str
    skipped: list[str] = field(default_factory=list)


def write_repro(art: Artifact, out: Path, flavor: str = "auto") -> ReproFile:
    """Write the repro file of a ``captures`` artifact and its data folder into ``out``.

    ``flavor`` is ``auto`` (source, else export), ``source`` or ``export``. Raises
    :class:`ModuleLensError` when no asked flavour can be written, saying why for each."""
    if flavor not in ("auto", *FLAVORS):
        raise ModuleLensError(f"unknown flavor {flavor!r}", "use auto, source or export")
    require_trusted(art, "export a repro of it")  # the repro inlines and runs the capture's stored code
    m = capture_manifest(art)
    rendered, skipped = _render(art, m, list(FLAVORS) if flavor == "auto" else [flavor])
    stem = f"{art.name.replace('.', '_').replace('-', '_')}_v{art.version}"
    data_name = f"{stem}_data"
    data_dir = out / data_name
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True)
    for f in DATA_FILES:
        if art.has_file(f):
            shutil.copyfile(art.file(f), data_dir / f)
    if rendered.flavor == "export":
        shutil.copyfile(art.file("program.pt2"), data_dir / "program.pt2")
    imports = "".join(f"import {mod}\n" for mod in sorted(rendered.imports))
    op_modules = sorted({mod for mods in m.export.custom_ops.values() for mod in mods}) if rendered.flavor == "export" else []
    needs = f" (and {', '.join(op_modules)}, for the program's custom operators)" if op_modules else ""
    body, future = _hoisted_future_imports(rendered.body)
    text = (
        _HEADER.format(ref=art.ref, class_path=m.class_path, module_path=m.module_path, data_name=data_name,
                       imports=imports, needs=needs, future=future)
        + body
        + _FOOTER.format(model=rendered.model, training=m.training, grad_enabled=m.grad_enabled, autocast=m.autocast,
                         state_keys=sorted(m.state_after), tolerance=VERIFY_TOLERANCE)
    )
    path = out / f"{stem}.py"
    path.write_text(text)
    return ReproFile(path=path, data_dir=data_dir, flavor=rendered.flavor, skipped=skipped)


_FUTURE_IMPORT = re.compile(r"^from __future__ import [^\n]*\n?", re.M)


def _hoisted_future_imports(body: str) -> tuple[str, str]:
    """``body`` without its top-level ``from __future__`` imports, and those imports (each once), to
    be put where Python requires them: before any other statement of the file (inlined code from a
    user file that starts with ``from __future__ import annotations`` is otherwise a SyntaxError)."""
    found = list(dict.fromkeys(m.group(0).rstrip("\n") for m in _FUTURE_IMPORT.finditer(body)))
    return _FUTURE_IMPORT.sub("", body), "".join(f"{line}\n" for line in found)


@dataclass(frozen=True)
class ReproCheck:
    """Running a repro file: whether it reproduced the captured outputs and changed state (max abs
    error within :data:`VERIFY_TOLERANCE`, exit status 0), the error it printed, why not, and the
    end of its output. ``timed_out``: the run was stopped at its time limit, so nothing is known
    of the file (``verified`` is False, ``reason`` says so)."""

    verified: bool
    max_abs_error: float | None
    output: str
    reason: str = ""
    timed_out: bool = False


def check_seconds_for(forward_seconds: float) -> float:
    """The default time limit of a repro's check run for a capture whose call took
    ``forward_seconds``: a fresh interpreter importing torch and loading the data (a minute on a
    busy machine) plus generous room for the one call (50 times the captured call)."""
    return 60.0 + 50.0 * max(forward_seconds, 0.0)


def _text(stream: str | bytes | None) -> str:
    return stream.decode(errors="replace") if isinstance(stream, bytes) else (stream or "")


def check_repro(path: Path, timeout: float = 600) -> ReproCheck:
    """Run a repro file once in a fresh, isolated interpreter (``python -I``: no ``PYTHONPATH``, no
    user site) from an empty folder, as a user who has only the file, its data folder, torch and
    safetensors would, and read the check it prints. A run past ``timeout`` seconds is killed and
    reported as timed out, never as a verdict on the file."""
    with tempfile.TemporaryDirectory(prefix="modulelens-repro-") as empty:
        try:
            proc = subprocess.run([sys.executable, "-I", str(path)], capture_output=True, text=True, timeout=timeout,
                                  cwd=empty)
        except subprocess.TimeoutExpired as exc:
            output = (_text(exc.stdout) + _text(exc.stderr))[-2000:]
            return ReproCheck(verified=False, max_abs_error=None, output=output, timed_out=True,
                              reason=f"the check run was stopped at its time limit of {timeout:g} s")
    output = (proc.stdout + proc.stderr)[-2000:]
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("max_abs_error=")), None)
    err = float(line.split()[0].split("=", 1)[1]) if line is not None else None
    if proc.returncode == 0 and err is not None and math.isfinite(err) and err <= VERIFY_TOLERANCE:
        return ReproCheck(verified=True, max_abs_error=err, output=output)
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    reason = lines[-1].strip() if lines else f"exit status {proc.returncode}"
    return ReproCheck(verified=False, max_abs_error=err, output=output, reason=reason[:500])
