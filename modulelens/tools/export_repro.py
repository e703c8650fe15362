"""export_repro: write a standalone KernelBench-format file for a capture.

The file defines ``Model``, ``get_inputs`` and ``get_init_inputs`` and needs only torch and
safetensors. Two flavours, tried in this order:

* ``source``: the source of the module's defining file (its definitions only) is inlined, and
  ``Model`` builds the module from the recorded constructor arguments: readable code an agent can
  optimise. Possible when that file imports nothing but torch, numpy, safetensors and the standard
  library.
* ``export``: ``Model`` wraps the saved ``torch.export`` program.

Captured weights, inputs, expected outputs and the RNG state sit in a folder next to the file.
Running the file checks the module against the captured outputs.
"""

from __future__ import annotations

import ast
import inspect
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from modulelens.capture.sources import definitions_source
from modulelens.errors import ModuleLensError
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Artifact, Repository

_ALLOWED_TOP = {"torch", "numpy", "safetensors", "math", "__future__"} | set(getattr(sys, "stdlib_module_names", ()))


class NotStandalone(Exception):
    pass


class ExportReproRequest(BaseModel):
    ref: str = Field(description="Capture reference: name, name:v3 or name@tag.", json_schema_extra={"cli": "argument"})
    out: str = Field("repros", description="Folder to write the repro file and its data folder into.")
    flavor: str = Field("auto", description="auto, source (inline the module's code) or export (wrap the torch.export program).")
    verify: bool = Field(True, description="Run the written file once in a fresh process and report its check.")


class ExportReproResult(BaseModel):
    ref: str
    path: str = Field(description="The standalone file.")
    data_dir: str
    flavor: str = Field(description="source or export.")
    skipped: list[str] = Field(default_factory=list, description="Why other flavours were not used.")
    verified: bool | None = Field(None, description="The file ran and reproduced the captured outputs (None: not run).")
    max_abs_error: float | None = None
    check_output: str = ""


def _top(module: str) -> str:
    return module.split(".", 1)[0]


class _Renderer:
    """Renders value specs as Python expressions for the generated file."""

    def __init__(self, inline: set[str]):
        self.inline = inline
        self.imports: set[str] = set()

    def cls(self, path: str) -> str:
        module, _, qual = path.partition(":")
        if module in self.inline:
            return qual
        if _top(module) not in _ALLOWED_TOP or "<locals>" in qual:
            raise NotStandalone(f"it needs {module}.{qual} from outside torch and the standard library")
        self.imports.add(module)
        return f"{module}.{qual}"

    def value(self, spec: Any) -> str:
        if not isinstance(spec, dict):
            return repr(spec)
        kind = spec.get("$")
        if kind == "tensor":
            if spec.get("stored", True):
                expr = f"_DATA[{spec['key']!r}]"
            else:
                expr = f"_synthesize({spec['shape']!r}, torch.{spec['dtype']}, {spec.get('stats', {})!r})"
            if spec.get("requires_grad"):
                expr += ".requires_grad_(True)"
            return expr
        if kind == "float":
            return f"float({spec['v']!r})"
        if kind == "dtype":
            return f"torch.{spec['name']}"
        if kind == "device":
            return f"torch.device({spec['v']!r})"
        if kind == "size":
            return f"torch.Size({spec['items']!r})"
        if kind == "enum":
            return f"{self.cls(spec['cls'])}.{spec['name']}"
        if kind == "type":
            return self.cls(spec["cls"])
        if kind == "callable":
            return self.cls(spec["path"])
        if kind == "complex":
            return f"complex({spec['re']!r}, {spec['im']!r})"
        if kind == "slice":
            return f"slice({', '.join(self.value(v) for v in spec['items'])})"
        if kind == "ellipsis":
            return "..."
        if kind == "number":
            return repr(spec["v"])
        if kind in ("list", "tuple"):
            items = ", ".join(self.value(v) for v in spec["items"])
            lit = f"[{items}]" if kind == "list" else f"({items}{',' if len(spec['items']) == 1 else ''})"
            return f"{self.cls(spec['cls'])}({lit})" if "cls" in spec else lit
        if kind == "dict":
            lit = "{" + ", ".join(f"{self.value(k)}: {self.value(v)}" for k, v in spec["items"]) + "}"
            return f"{self.cls(spec['cls'])}({lit})" if "cls" in spec else lit
        if kind in ("namedtuple", "dataclass"):
            fields = ", ".join(f"{k}={self.value(v)}" for k, v in spec["fields"].items())
            return f"{self.cls(spec['cls'])}({fields})"
        if kind == "object":
            state = "{" + ", ".join(f"{k!r}: {self.value(v)}" for k, v in spec["state"].items()) + "}"
            return f"_restore({self.cls(spec['cls'])}, {state})"
        if kind == "module":
            parts = [self.value(a) for a in spec["args"]] + [f"{k}={self.value(v)}" for k, v in spec["kwargs"].items()]
            return f"{self.cls(spec['cls'])}({', '.join(parts)})"
        raise NotStandalone(f"a value of type {spec.get('type', kind)} was not recorded")


def _user_modules(spec: Any) -> set[str]:
    """Modules of the classes a construction spec refers to, other than torch and the standard library."""
    from modulelens.capture.artifact import source_modules

    return {m for m in source_modules(spec, set()) if _top(m) not in _ALLOWED_TOP}


def _module_source(art: Artifact, module: str) -> str:
    stored = art.manifest.get("sources", {}).get(module)
    if stored:
        return art.file(stored["file"]).read_text()
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

KernelBench format: Model, get_inputs(), get_init_inputs(). Needs only torch and safetensors.
Captured data lives in {data_name}/. Run this file to check Model against the captured outputs.
"""
import math
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import load_file
{imports}
_HERE = Path(__file__).resolve().parent / {data_name!r}
_DATA = load_file(str(_HERE / "inputs.safetensors")) if (_HERE / "inputs.safetensors").exists() else {{}}


def _synthesize(shape, dtype, stats):
    """Random data like a tensor that was stored shape-only (normal, clipped, zeros kept)."""
    if dtype == torch.bool:
        return torch.rand(shape) >= stats.get("zero_fraction", 0.0)
    lo, hi = stats.get("min", 0.0), stats.get("max", 1.0)
    if not dtype.is_floating_point:
        return torch.randint(int(lo), int(hi) + 1, shape).to(dtype)
    x = (torch.randn(shape, dtype=torch.float64) * stats.get("std", 1.0) + stats.get("mean", 0.0)).clamp(lo, hi)
    return x.to(dtype)


def _restore(cls, state):
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj

'''

_FOOTER = '''

KWARG_NAMES = {kwarg_names!r}
TRAINING = {training!r}


class Model(nn.Module):
    """The captured module with the captured weights. forward(*inputs): the captured positional
    inputs, then the keyword inputs named in KWARG_NAMES, in that order."""

    def __init__(self):
        super().__init__()
{build}

    def forward(self, *inputs):
        n = len(inputs) - len(KWARG_NAMES)
        return self.inner(*inputs[:n], **dict(zip(KWARG_NAMES, inputs[n:])))


def get_inputs():
    args = {args}
    kwargs = {kwargs}
    return list(args) + [kwargs[k] for k in KWARG_NAMES]


def get_init_inputs():
    return []


def _leaves(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _leaves(v)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _leaves(v)]
    return []


if __name__ == "__main__":
    model = Model(*get_init_inputs())
    inputs = get_inputs()
    rng = _HERE / "rng.safetensors"
    if rng.exists():
        torch.random.set_rng_state(load_file(str(rng))["cpu"])
    with torch.set_grad_enabled({grad_enabled!r}):
        out = model(*inputs)
    expected = load_file(str(_HERE / "outputs.safetensors")) if (_HERE / "outputs.safetensors").exists() else {{}}
    got = _leaves(out)
    keys = {output_keys!r}
    worst = 0.0
    for key, t in zip(keys, got):
        if key in expected:
            worst = max(worst, (t.detach().double() - expected[key].double()).abs().max().item() if t.numel() else 0.0)
    print(f"max_abs_error={{worst!r}} outputs={{len(got)}}")
'''


def _source_build(art: Artifact, r: _Renderer) -> tuple[str, str]:
    m = art.manifest
    if "source" not in m["strategies"] or not m.get("init"):
        raise NotStandalone("the capture has no recorded construction (no source strategy)")
    users = _user_modules(m["init"])
    if len(users) > 1:
        raise NotStandalone(f"the module's code spans several files ({', '.join(sorted(users))})")
    body = ""
    if users:
        (module,) = users
        source = definitions_source(_module_source(art, module), module)
        _check_imports(source, module)
        body = f"# ---- definitions from {module} ----\n{source}\n# ---- end of {module} ----\n"
        r.inline = {module}
    build = f"        self.inner = {r.value(m['init'])}\n        self.inner.load_state_dict(load_file(str(_HERE / 'weights.safetensors')), strict=False)\n        self.inner.train(TRAINING)"
    return body, build


def _export_build(art: Artifact) -> tuple[str, str]:
    if "export" not in art.manifest["strategies"]:
        raise NotStandalone("the capture has no torch.export program")
    # An exported program keeps the train/eval behaviour it was exported with.
    return "", "        self.inner = torch.export.load(str(_HERE / 'program.pt2')).module()"


def export_repro(req: ExportReproRequest, ctx: ToolContext) -> ExportReproResult:
    if req.flavor not in ("auto", "source", "export"):
        raise ModuleLensError(f"unknown flavor {req.flavor!r}", "use auto, source or export")
    art = Repository(ctx.repo_root).open("captures", req.ref)
    m = art.manifest
    from modulelens.capture.values import leaves

    skipped: list[str] = []
    chosen = None
    for flavor in (["source", "export"] if req.flavor == "auto" else [req.flavor]):
        r = _Renderer(set())
        try:
            body, build = _source_build(art, r) if flavor == "source" else _export_build(art)
            args = r.value(m["inputs"]["args"])
            kwargs = r.value(m["inputs"]["kwargs"])
            chosen = (flavor, body, build, args, kwargs, r)
            break
        except NotStandalone as e:
            skipped.append(f"{flavor}: {e}")
    if chosen is None:
        raise ModuleLensError(f"cannot write a standalone repro of {art.ref}: " + "; ".join(skipped),
                              "capture with export enabled, or keep the model's code importable with only torch")
    flavor, body, build, args, kwargs, r = chosen
    out = Path(req.out).expanduser().resolve()
    stem = f"{art.name.replace('.', '_').replace('-', '_')}_v{art.version}"
    data_name = f"{stem}_data"
    data_dir = out / data_name
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True)
    for f in ("inputs.safetensors", "outputs.safetensors", "rng.safetensors", "weights.safetensors"):
        if art.has_file(f):
            shutil.copyfile(art.file(f), data_dir / f)
    if flavor == "export":
        shutil.copyfile(art.file("program.pt2"), data_dir / "program.pt2")
    kw_names = [item[0] for item in m["inputs"]["kwargs"]["items"]] if isinstance(m["inputs"]["kwargs"], dict) else []
    imports = "".join(f"import {mod}\n" for mod in sorted(r.imports))
    text = (
        _HEADER.format(ref=art.ref, class_path=m["class_path"], module_path=m["module_path"], data_name=data_name, imports=imports)
        + body
        + _FOOTER.format(
            kwarg_names=kw_names, training=m["training"], build=build, args=args, kwargs=kwargs,
            grad_enabled=bool(m["grad_enabled"]), output_keys=[s["key"] for s in leaves(m["outputs"])],
        )
    )
    path = out / f"{stem}.py"
    path.write_text(text)
    result = ExportReproResult(ref=art.ref, path=str(path), data_dir=str(data_dir), flavor=flavor, skipped=skipped)
    if req.verify:
        proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600, cwd=str(out))
        result.check_output = (proc.stdout + proc.stderr)[-2000:]
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("max_abs_error=")), None)
        if proc.returncode == 0 and line:
            err = float(line.split()[0].split("=", 1)[1])
            result.max_abs_error = err
            result.verified = math.isfinite(err) and err <= 1e-5
        else:
            result.verified = False
    return result


def _render(r: ExportReproResult):
    from rich.markup import escape

    check = "not run" if r.verified is None else ("reproduces the capture" if r.verified else "[red]did not reproduce[/]")
    return escape(f"wrote {r.path} ({r.flavor}); data in {r.data_dir}\n") + f"check: {check}" + escape((
        f" (max abs error {r.max_abs_error})" if r.max_abs_error is not None else "") + "".join(
        f"\nskipped {s}" for s in r.skipped))


TOOL = register(
    Tool(
        name="export_repro",
        request=ExportReproRequest,
        result=ExportReproResult,
        fn=export_repro,
        summary="Write a standalone KernelBench-format file (Model, get_inputs, get_init_inputs) for a capture, "
        "with its captured data; needs only torch and safetensors to run.",
        render=_render,
    )
)
