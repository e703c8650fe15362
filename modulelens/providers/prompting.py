"""What modulelens says to an LLM and how it reads the reply: the kernel prompts (templates in
``modulelens/prompts/``) filled from an operator card, and the code block taken out of the reply.

Shared by the LLM providers (anthropic, sampling) through :func:`build_messages` and
:func:`extract_code`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from modulelens.capture import SpecVisitor, TensorSpec, ValueKind, mapping_items, sequence_items
from modulelens.errors import ModuleLensError
from modulelens.kernels import CPP_KEYWORDS
from modulelens.ops import OpCard, as_card
from modulelens.providers.request import GenerationRequest
from modulelens.providers.values import describe_value, spec_tensor_text, tensor_text, value_kind

__all__ = ["build_messages", "card_fields", "contract_text", "describe_arguments", "extract_code", "fence",
           "prompt_sha256", "repair_task", "report_text"]

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
            f"the reply must hold the source in one fenced block (```{fence(backend)} ... ```); "
            f"it began: {head!r}" if head else "the reply was empty; try again or use another provider",
        )
    wanted = _LANGS.get(backend, ())
    matching = [code for lang, code in blocks if lang in wanted]
    code = max(matching or [code for _, code in blocks], key=len)
    return code.strip("\n") + "\n"


def fence(backend: str) -> str:
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
    from modulelens.kernels import CANDIDATE_CONTRACT

    doc = (CANDIDATE_CONTRACT or "").split("For a whole captured module")[0]
    bullets: list[str] = []
    for line in doc.splitlines():
        s = line.strip()
        if s.startswith("* "):
            bullets.append(s[2:])
        elif s and bullets:
            bullets[-1] += " " + s
    return "\n".join("- " + b.replace("``", "`") for b in bullets)


def _schema_arguments(op: str) -> tuple[list[Any], list[str]]:
    """(arguments, return type strings) of the aten schema, or empty lists when torch cannot say."""
    try:
        from modulelens.ops import resolve_op

        schema = resolve_op(op)._schema
        return list(schema.arguments), [str(r.type) for r in schema.returns]
    except Exception:  # noqa: BLE001 - the schema only improves names; the card is enough
        return [], []


def describe_arguments(card: OpCard | Mapping[str, Any], backend: str) -> list[dict[str, str]]:
    """The entry point's positional arguments for ``card``, from its first stored sample: the
    positional arguments, then the keyword arguments' values in stored order. Each entry has
    ``name``, ``cpp``, ``python`` and ``text`` (type/shape/dtype/value in words)."""
    card = as_card(card)
    if not card.samples:
        return _arguments_without_sample(card)
    sample = card.samples[0]
    positional = sequence_items(sample.args)
    keyword = mapping_items(sample.kwargs)
    schema, _ = _schema_arguments(card.op)
    by_name = {a.name: a for a in schema}
    out = []
    for i, value in enumerate(positional):
        arg = schema[i] if i < len(schema) else None
        name = arg.name if arg is not None else f"arg{i}"
        cpp, py, text = describe_value(value, str(arg.type) if arg is not None else None)
        out.append({"name": name, "cpp": cpp, "python": py, "text": text, "keyword": ""})
    for key, value in keyword:
        arg = by_name.get(key)
        cpp, py, text = describe_value(value, str(arg.type) if arg is not None else None)
        out.append({"name": str(key), "cpp": cpp, "python": py, "text": text, "keyword": str(key)})
    return out


def _arguments_without_sample(card: OpCard) -> list[dict[str, str]]:
    out = []
    for i, (shape, dtype) in enumerate(zip(card.shapes, card.dtypes)):
        text = tensor_text(shape, dtype, (card.strides or [None] * (i + 1))[i],
                           (card.contiguous or [True] * (i + 1))[i])
        out.append({"name": f"arg{i}", "cpp": "torch::Tensor", "python": "torch.Tensor",
                    "text": "Tensor, " + text, "keyword": ""})
    return out


class _ReturnDescriber(SpecVisitor[tuple[str, str]]):
    """(words, C++ return type) for a stored output: one tensor, a tuple or list of tensors, or
    what the aten operator returns (its kind in words)."""

    def tensor(self, spec: TensorSpec) -> tuple[str, str]:
        return f"one tensor ({spec_tensor_text(spec)})", "torch::Tensor"

    def sequence(self, kind: ValueKind, items: list[Any], cls: str | None) -> tuple[str, str]:
        if not items or any(value_kind(i) != "tensor" for i in items):
            return self._other(kind.value)
        parts = "; ".join(f"[{i}] {spec_tensor_text(TensorSpec.from_json(t))}" for i, t in enumerate(items))
        return (f"a tuple of {len(items)} tensors: {parts}",
                "std::tuple<" + ", ".join(["torch::Tensor"] * len(items)) + ">")

    def scalar(self, value: Any) -> tuple[str, str]:
        return self._other(value_kind(value))

    def unsupported(self, kind: ValueKind, spec: dict[str, Any]) -> tuple[str, str]:
        return self._other(kind.value)

    def unknown_kind(self, kind: str, spec: dict[str, Any]) -> tuple[str, str]:
        return self._other(kind)

    def malformed(self, spec: Any, why: str) -> tuple[str, str]:
        return self._other(value_kind(spec))

    @staticmethod
    def _other(kind: str) -> tuple[str, str]:
        return f"what the aten operator returns ({kind})", "py::object"


def _describe_returns(card: OpCard) -> tuple[str, str]:
    """(words, C++ return type) for what ``forward`` returns: from the first sample's output, or
    from the aten schema for a card without samples."""
    if card.samples:
        return _ReturnDescriber().visit(card.samples[0].output)
    _, returns = _schema_arguments(card.op)
    if len(returns) > 1:
        return (f"a tuple of {len(returns)} tensors, as the aten operator does",
                "std::tuple<" + ", ".join(["torch::Tensor"] * len(returns)) + ">")
    return "one tensor, as the aten operator does", "torch::Tensor"


def _signature(args: list[dict[str, str]], backend: str, ret_cpp: str) -> str:
    if backend == "triton":
        params = ", ".join(f"{a['name']}: {a['python']}" for a in args)
        return f"```python\ndef forward({params}):\n```"
    params = ", ".join(f"{a['cpp']} {_cpp_name(a['name'])}" for a in args)
    return f"```cpp\n{ret_cpp} forward({params});\n```"


def _cpp_name(name: str) -> str:
    return name + "_" if name in CPP_KEYWORDS else name


def _percent(x: Any) -> str:
    try:
        return f"{float(x):.1%}"
    except (TypeError, ValueError):
        return "an unknown share"


def _stated(card: OpCard, name: str) -> Any:
    """A measurement the card states, or None for a card made by hand that leaves it out."""
    return getattr(card, name) if name in card.model_fields_set else None


def card_fields(card: OpCard, backend: str) -> dict[str, Any]:
    """The placeholders the kernel prompts share, derived from the card."""
    args = describe_arguments(card, backend)
    returns, ret_cpp = _describe_returns(card)
    shapes = card.shapes
    tensors = [
        f"- {shape} {dtype} strides {stride} {'contiguous' if contig else 'non-contiguous'}"
        for shape, dtype, stride, contig in zip(shapes, card.dtypes, card.strides or [None] * len(shapes),
                                                 card.contiguous or [True] * len(shapes))
    ]
    arg_lines = []
    for i, a in enumerate(args):
        kw = f" (keyword `{a['keyword']}`)" if a["keyword"] else ""
        typ = a["python"] if backend == "triton" else a["cpp"]
        arg_lines.append(f"{i}. `{a['name']}`{kw}: {a['text']}; declare as `{typ}`")
    others = card.args
    calls, bytes_per_call = _stated(card, "calls"), _stated(card, "bytes_per_call")
    return {
        "backend": backend,
        "backend_title": _BACKEND_TITLE.get(backend, backend),
        "fence": fence(backend),
        "op": card.op,
        "kind": card.kind,
        "phase": card.phase,
        "device": card.device,
        "calls": "?" if calls is None else calls,
        "time_share": _percent(_stated(card, "time_share")),
        "bytes_per_call": "?" if bytes_per_call is None else bytes_per_call,
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


def report_text(report: dict[str, Any]) -> str:
    """A validation report (as JSON) in lines for a repair prompt: verdict, speed and errors, capped."""
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


def repair_task(report: dict[str, Any]) -> str:
    """What a repair prompt asks, from the parent's report: fix it, stop wrapping torch, or make it faster."""
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


def user_prompt(req: Any, fields: dict[str, Any], repair: str, generate: str) -> str:
    """The user prompt of a generation request (a kernel's or a ModelNew's): the ``repair``
    template with the parent's source, its report and what to do about it when ``req`` has a
    parent and its report, else the ``generate`` template; ``fields`` fill either."""
    from modulelens.prompts import render

    if req.parent is not None and req.parent_report is not None:
        return render(repair, **fields, parent_source=req.parent.source.strip("\n"),
                      report=report_text(req.parent_report), task=repair_task(req.parent_report))
    return render(generate, **fields)


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
    return render("system", **fields), user_prompt(req, fields, "repair_kernel", "generate_kernel")


