"""The provider protocol, the generation request, and what all providers share.

A provider turns a :class:`GenerationRequest` (an operator card, a backend, optionally a parent
candidate with its validation report) into a :class:`~modulelens.kernels.source.KernelSource`
whose ``provenance`` says where it came from. Providers: ``template`` (offline, deterministic),
``anthropic`` (the Anthropic Messages API) and ``sampling`` (MCP sampling: the connected client's
own model). The fourth source of candidates, the agent itself, needs no provider: it passes its
source to ``validate_kernel``.

LLM providers share :func:`build_messages` (the prompts in ``modulelens/prompts/``) and
:func:`extract_code` (the code block out of the model's reply).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from modulelens.errors import ModuleLensError
from modulelens.kernels.source import KernelSource

__all__ = [
    "PROVIDERS",
    "GenerationRequest",
    "Provider",
    "build_messages",
    "describe_arguments",
    "extract_code",
    "get_provider",
    "prompt_sha256",
]

PROVIDERS = ("template", "anthropic", "sampling")


class GenerationRequest(BaseModel):
    card: dict[str, Any] = Field(description="The operator card entry (as stored in the opset manifest).")
    backend: Literal["cpp", "cuda", "triton"]
    parent: KernelSource | None = Field(None, description="The candidate to mutate or repair.")
    parent_report: dict[str, Any] | None = Field(
        None, description="The parent's validation report (verdict, correct, reason, errors, speedup_vs_eager, timing).")
    instructions: str | None = Field(None, description="Extra guidance from the user or agent.")
    variant: int = Field(0, ge=0, description="Which variant to produce (template index; a diversity hint for LLMs).")


@runtime_checkable
class Provider(Protocol):
    name: str

    def generate(self, req: GenerationRequest, ctx: Any) -> KernelSource:
        """One candidate for ``req``; raises ModuleLensError with a hint when it cannot."""
        ...


def get_provider(name: str) -> Provider:
    if name == "template":
        from modulelens.providers.template import TemplateProvider

        return TemplateProvider()
    if name == "anthropic":
        from modulelens.providers.anthropic import AnthropicProvider

        return AnthropicProvider()
    if name == "sampling":
        from modulelens.providers.sampling import SamplingProvider

        return SamplingProvider()
    raise ModuleLensError(
        f"unknown provider {name!r}",
        f"use one of: {', '.join(PROVIDERS)}; or write the kernel yourself and pass it to validate_kernel",
    )


# --- code extraction -------------------------------------------------------------------------

_FENCE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})[ \t]*([^\s`]*)[^\n]*\n(.*?)^[ \t]{0,3}\1[ \t]*$", re.M | re.S)

_LANGS: dict[str, tuple[str, ...]] = {
    "cpp": ("cpp", "c++", "cxx", "cc", "c", "hpp", "h"),
    "cuda": ("cuda", "cu", "cpp", "c++", "cxx", "cc", "c"),
    "triton": ("python", "py", "python3", "triton"),
}


def extract_code(text: str, backend: str) -> str:
    """The code in an LLM reply: the largest fenced block whose language matches ``backend``
    (```cpp / ```c++ for cpp, ```cuda / ```cpp for cuda, ```python for triton), else the largest
    fenced block of any language. Raises ModuleLensError when the reply has no complete block."""
    blocks = [(m.group(2).lower(), m.group(3)) for m in _FENCE.finditer(text or "")]
    blocks = [(lang, code) for lang, code in blocks if code.strip()]
    if not blocks:
        head = (text or "").strip()[:200]
        raise ModuleLensError(
            "the model's reply contained no code block",
            f"the reply must hold the source in one fenced block (```{_fence(backend)} ... ```); "
            f"it began: {head!r}" if head else "the reply was empty; try again or use another provider",
        )
    wanted = _LANGS.get(backend, ())
    matching = [code for lang, code in blocks if lang in wanted]
    code = max(matching or [code for _, code in blocks], key=len)
    return code.strip("\n") + "\n"


def _fence(backend: str) -> str:
    return {"cpp": "cpp", "cuda": "cuda", "triton": "python"}.get(backend, "")


# --- prompts ---------------------------------------------------------------------------------

_BACKEND_TITLE = {"cpp": "C++ (CPU)", "cuda": "CUDA", "triton": "Triton"}

_BACKEND_NOTES = {
    "cpp": (
        "- C++17 for the CPU, compiled with `torch.utils.cpp_extension.load_inline` as `cpp_sources` with "
        "`functions=[\"forward\"]`: include `<torch/extension.h>`, define `forward` at namespace scope, and do not "
        "write `PYBIND11_MODULE` (the binding is generated).\n"
        "- Read inputs through `data_ptr<T>()` with their real strides (or call `.contiguous()` on a copy only "
        "when that is cheap); allocate outputs with `torch::empty(sizes, input.options())`."
    ),
    "cuda": (
        "- CUDA C++ compiled with `torch.utils.cpp_extension.load_inline` as `cuda_sources` with "
        "`functions=[\"forward\"]`: include `<torch/extension.h>`, write `__global__` kernels and a host "
        "`forward` that launches them on `at::cuda::getCurrentCUDAStream()` (include "
        "`<ATen/cuda/CUDAContext.h>`); do not write `PYBIND11_MODULE`.\n"
        "- Tensors arrive on the CUDA device. Check `cudaGetLastError()` after launches; allocate outputs with `torch::empty(sizes, input.options())`."
    ),
    "triton": (
        "- A Python module: `import torch`, `import triton`, `import triton.language as tl`; `@triton.jit` "
        "kernels and a plain Python `def forward(...)` that allocates outputs with `torch.empty` and launches them.\n"
        "- Tensors arrive on the GPU; without one it runs under `TRITON_INTERPRET=1` on CPU tensors, so use only documented `tl` operations; mask every "
        "load and store at the edges."
    ),
}


def contract_text() -> str:
    """The candidate contract, as stated in :mod:`modulelens.kernels.source` (its bullet list)."""
    import modulelens.kernels.source as source

    doc = (source.__doc__ or "").split("For a whole captured module")[0]
    bullets: list[str] = []
    for line in doc.splitlines():
        s = line.strip()
        if s.startswith("* "):
            bullets.append(s[2:])
        elif s and bullets:
            bullets[-1] += " " + s
    return "\n".join("- " + b.replace("``", "`") for b in bullets)


def _value_kind(spec: Any) -> str:
    if isinstance(spec, dict):
        return spec.get("$", "dict")
    return type(spec).__name__


def _items(spec: Any) -> list[Any]:
    return list(spec.get("items", [])) if isinstance(spec, dict) else []


def _tensor_text(t: dict[str, Any]) -> str:
    contig = "contiguous" if t.get("contiguous") else "non-contiguous"
    return f"shape {t.get('shape')}, {t.get('dtype')}, strides {t.get('stride')} ({contig})"


_CPP_SCALAR = {"bool": "bool", "int": "int64_t", "float": "double", "str": "std::string"}
_PY_SCALAR = {"bool": "bool", "int": "int", "float": "float", "str": "str"}


def _schema_optional(schema_type: str | None) -> tuple[str, str]:
    """C++ and Python types for a None value, from the schema's ``Optional[...]`` type."""
    inner = (schema_type or "").removeprefix("Optional[").removesuffix("]")
    table = {
        "Tensor": ("c10::optional<torch::Tensor>", "torch.Tensor | None"),
        "int": ("c10::optional<int64_t>", "int | None"),
        "float": ("c10::optional<double>", "float | None"),
        "bool": ("c10::optional<bool>", "bool | None"),
        "List[int]": ("c10::optional<std::vector<int64_t>>", "list[int] | None"),
        "number": ("c10::optional<double>", "float | None"),
    }
    return table.get(inner, ("c10::optional<torch::Tensor>", "None"))


def _describe_value(spec: Any, schema_type: str | None) -> tuple[str, str, str]:
    """(C++ type, Python type, description) of one stored argument value."""
    kind = _value_kind(spec)
    if kind == "tensor":
        return "torch::Tensor", "torch.Tensor", "Tensor, " + _tensor_text(spec)
    if spec is None:
        cpp, py = _schema_optional(schema_type)
        return cpp, py, "None"
    if isinstance(spec, (bool, int, float, str)):
        name = type(spec).__name__
        return _CPP_SCALAR[name], _PY_SCALAR[name], f"{name} = {spec!r}"
    if kind == "float":  # inf / nan
        return "double", "float", f"float = {spec.get('v')}"
    if kind in ("list", "tuple", "size"):
        items = _items(spec)
        kinds = {_value_kind(i) for i in items}
        if kinds <= {"int"}:
            return "std::vector<int64_t>", "list[int]", f"list of int = {items}"
        if kinds <= {"int", "float"}:
            return "std::vector<double>", "list[float]", f"list of float = {items}"
        if kinds <= {"bool"}:
            return "std::vector<bool>", "list[bool]", f"list of bool = {items}"
        if kinds <= {"tensor"}:
            shapes = "; ".join(_tensor_text(i) for i in items)
            return "std::vector<torch::Tensor>", "list[torch.Tensor]", f"list of {len(items)} tensors: {shapes}"
        if kinds <= {"tensor", "NoneType"}:
            shapes = "; ".join("None" if i is None else _tensor_text(i) for i in items)
            return ("std::vector<c10::optional<torch::Tensor>>", "list[torch.Tensor | None]",
                    f"list of {len(items)} optional tensors: {shapes}")
    if kind == "dtype":
        return "at::ScalarType", "torch.dtype", f"torch.dtype = {spec.get('name')}"
    if kind == "device":
        return "at::Device", "torch.device", f"torch.device = {spec.get('v')!r}"
    if kind == "torch":
        return "at::MemoryFormat", "torch object", f"torch.{spec.get('name')}"
    if kind == "number":
        v = spec.get("v")
        return ("int64_t", "int", f"int = {v!r}") if isinstance(v, int) else ("double", "float", f"float = {v!r}")
    return "py::object", "object", f"{kind} value {json.dumps(spec, default=str)[:200]}"


def _schema_arguments(op: str) -> tuple[list[Any], list[str]]:
    """(arguments, return type strings) of the aten schema, or empty lists when torch cannot say."""
    try:
        from modulelens.ops.recorder import resolve_op

        schema = resolve_op(op)._schema
        return list(schema.arguments), [str(r.type) for r in schema.returns]
    except Exception:  # noqa: BLE001 - the schema only improves names; the card is enough
        return [], []


def describe_arguments(card: dict[str, Any], backend: str) -> list[dict[str, str]]:
    """The entry point's positional arguments for ``card``, from its first stored sample: the
    positional arguments, then the keyword arguments' values in stored order. Each entry has
    ``name``, ``cpp``, ``python`` and ``text`` (type/shape/dtype/value in words)."""
    samples = card.get("samples") or []
    if not samples:
        return _arguments_without_sample(card)
    sample = samples[0]
    positional = _items(sample.get("args"))
    keyword = [(k, v) for k, v in _items(sample.get("kwargs"))]
    schema, _ = _schema_arguments(card.get("op", ""))
    by_name = {a.name: a for a in schema}
    out = []
    for i, value in enumerate(positional):
        arg = schema[i] if i < len(schema) else None
        name = arg.name if arg is not None else f"arg{i}"
        cpp, py, text = _describe_value(value, str(arg.type) if arg is not None else None)
        out.append({"name": name, "cpp": cpp, "python": py, "text": text, "keyword": ""})
    for key, value in keyword:
        arg = by_name.get(key)
        cpp, py, text = _describe_value(value, str(arg.type) if arg is not None else None)
        out.append({"name": str(key), "cpp": cpp, "python": py, "text": text, "keyword": str(key)})
    return out


def _arguments_without_sample(card: dict[str, Any]) -> list[dict[str, str]]:
    out = []
    for i, (shape, dtype) in enumerate(zip(card.get("shapes", []), card.get("dtypes", []))):
        t = {"shape": shape, "dtype": dtype, "stride": (card.get("strides") or [None] * (i + 1))[i],
             "contiguous": (card.get("contiguous") or [True] * (i + 1))[i], "device": card.get("device", "cpu")}
        out.append({"name": f"arg{i}", "cpp": "torch::Tensor", "python": "torch.Tensor",
                    "text": "Tensor, " + _tensor_text(t), "keyword": ""})
    return out


def _describe_returns(card: dict[str, Any], backend: str) -> tuple[str, str]:
    """(words, C++ return type) for what ``forward`` returns."""
    samples = card.get("samples") or []
    out = samples[0].get("output") if samples else None
    kind = _value_kind(out)
    if kind == "tensor":
        return f"one tensor ({_tensor_text(out)})", "torch::Tensor"
    if kind in ("tuple", "list") and _items(out) and all(_value_kind(i) == "tensor" for i in _items(out)):
        items = _items(out)
        parts = "; ".join(f"[{i}] {_tensor_text(t)}" for i, t in enumerate(items))
        return (f"a tuple of {len(items)} tensors: {parts}",
                "std::tuple<" + ", ".join(["torch::Tensor"] * len(items)) + ">")
    if out is None and not samples:
        _, returns = _schema_arguments(card.get("op", ""))
        if len(returns) > 1:
            return (f"a tuple of {len(returns)} tensors, as the aten operator does",
                    "std::tuple<" + ", ".join(["torch::Tensor"] * len(returns)) + ">")
        return "one tensor, as the aten operator does", "torch::Tensor"
    return f"what the aten operator returns ({kind})", "py::object"


def _signature(args: list[dict[str, str]], backend: str, ret_cpp: str) -> str:
    if backend == "triton":
        params = ", ".join(f"{a['name']}: {a['python']}" for a in args)
        return f"```python\ndef forward({params}):\n```"
    params = ", ".join(f"{a['cpp']} {_cpp_name(a['name'])}" for a in args)
    return f"```cpp\n{ret_cpp} forward({params});\n```"


_CPP_RESERVED = {
    "and", "auto", "bool", "case", "char", "class", "const", "default", "delete", "do", "double", "enum", "float",
    "for", "if", "int", "long", "namespace", "new", "not", "operator", "or", "private", "public", "register",
    "return", "short", "signed", "sizeof", "static", "struct", "switch", "template", "this", "union", "unsigned",
    "void", "while", "xor",
}


def _cpp_name(name: str) -> str:
    return name + "_" if name in _CPP_RESERVED else name


def _percent(x: Any) -> str:
    try:
        return f"{float(x):.1%}"
    except (TypeError, ValueError):
        return "an unknown share"


def card_fields(card: dict[str, Any], backend: str) -> dict[str, Any]:
    """The placeholders the kernel prompts share, derived from the card."""
    args = describe_arguments(card, backend)
    returns, ret_cpp = _describe_returns(card, backend)
    tensors = [
        f"- {shape} {dtype} strides {stride} {'contiguous' if contig else 'non-contiguous'}"
        for shape, dtype, stride, contig in zip(card.get("shapes", []), card.get("dtypes", []),
                                                 card.get("strides", []) or [None] * len(card.get("shapes", [])),
                                                 card.get("contiguous", []) or [True] * len(card.get("shapes", [])))
    ]
    arg_lines = []
    for i, a in enumerate(args):
        kw = f" (keyword `{a['keyword']}`)" if a["keyword"] else ""
        typ = a["python"] if backend == "triton" else a["cpp"]
        arg_lines.append(f"{i}. `{a['name']}`{kw}: {a['text']}; declare as `{typ}`")
    others = card.get("args")
    return {
        "backend": backend,
        "backend_title": _BACKEND_TITLE.get(backend, backend),
        "fence": _fence(backend),
        "op": card.get("op", "?"),
        "kind": card.get("kind", "compute"),
        "phase": card.get("phase", "forward"),
        "device": card.get("device", "cpu"),
        "calls": card.get("calls", "?"),
        "time_share": _percent(card.get("time_share")),
        "bytes_per_call": card.get("bytes_per_call", "?"),
        "tensors": "\n".join(tensors) or "- none",
        "other_args": json.dumps(others, default=str) if others else "none",
        "n_args": len(args),
        "arg_list": "\n".join(arg_lines) or "(none)",
        "returns": returns,
        "signature": _signature(args, backend, ret_cpp),
    }


_REPORT_KEYS = ("verdict", "correct", "reason", "speedup_vs_eager", "speedup_vs_compile", "timing")
_MAX_ERROR_CHARS = 2000
_MAX_ERRORS_CHARS = 6000


def _report_text(report: dict[str, Any]) -> str:
    lines = []
    for key in _REPORT_KEYS:
        if report.get(key) is not None:
            v = report[key]
            lines.append(f"- {key}: {v if isinstance(v, (str, int, float, bool)) else json.dumps(v, default=str)}")
    errors = report.get("errors")
    if isinstance(errors, (str, dict)):
        errors = [errors]
    if errors:
        lines.append("- errors:")
        budget = _MAX_ERRORS_CHARS
        for e in errors:
            text = e if isinstance(e, str) else json.dumps(e, default=str)
            text = text[:_MAX_ERROR_CHARS] + (" [...]" if len(text) > _MAX_ERROR_CHARS else "")
            if budget <= 0:
                lines.append("  (more errors omitted)")
                break
            budget -= len(text)
            lines.append("  " + text.replace("\n", "\n  "))
    return "\n".join(lines) or "- (empty report)"


def _repair_task(report: dict[str, Any]) -> str:
    verdict = str(report.get("verdict") or "").lower()
    if report.get("correct") is False or verdict in ("rejected", "error", "failed", "incorrect"):
        return ("It failed validation. Fix the cause of the errors above and return a corrected, complete version; "
                "keep what already worked.")
    if "wrapper" in verdict:
        return ("It calls back into torch for the computation, so it counts as a wrapper. Replace those calls with "
                "your own kernel code and keep it correct.")
    speed = report.get("speedup_vs_eager")
    at = f" (now {speed}x eager)" if speed is not None else ""
    return f"It is correct. Make it faster{at}, keeping it correct: better memory access, vectorisation, fusion, tiling."


def prompt_sha256(system: str, user: str) -> str:
    return hashlib.sha256(f"{system}\0{user}".encode()).hexdigest()


def build_messages(req: GenerationRequest) -> tuple[str, str]:
    """(system prompt, user prompt) for ``req``: ``repair_kernel`` when a parent and its report are
    given, ``generate_kernel`` otherwise."""
    from modulelens.prompts import render

    fields = card_fields(req.card, req.backend)
    fields["contract"] = contract_text()
    fields["backend_notes"] = _BACKEND_NOTES[req.backend]
    fields["instructions"] = f"\nAdditional instructions:\n{req.instructions.strip()}\n" if req.instructions else ""
    fields["variant_note"] = (
        f"\nThis is variant {req.variant}: take a different implementation approach (work split, tiling, "
        "vectorisation) than the most obvious one.\n" if req.variant else ""
    )
    system = render("system", **fields)
    if req.parent is not None and req.parent_report is not None:
        user = render("repair_kernel", **fields, parent_source=req.parent.source.strip("\n"),
                      report=_report_text(req.parent_report), task=_repair_task(req.parent_report))
    else:
        user = render("generate_kernel", **fields)
    return system, user


def lineage(req: GenerationRequest) -> dict[str, Any]:
    """Provenance entries about the parent (empty without one)."""
    if req.parent is None:
        return {}
    out: dict[str, Any] = {"parent": req.parent.sha256, "parent_provider": req.parent.provider}
    if req.parent_report is not None and req.parent_report.get("verdict") is not None:
        out["parent_verdict"] = req.parent_report.get("verdict")
    return out
