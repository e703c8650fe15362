"""A candidate kernel's source and where it came from.

The candidate contract for an operator card (documented for agents in skills/optimize-kernel):

* The source defines an entry point named ``forward`` (``KernelSource.entry``).
* ``forward`` takes the card operator's arguments in the order of the card's stored sample:
  the positional arguments, then the keyword arguments' values in stored order. Tensors arrive as
  tensors; other arguments as Python values (int, float, bool, None, list of int).
* It returns what the aten operator returns: one tensor, or a tuple of tensors for operators with
  several outputs (``native_layer_norm`` returns ``(out, mean, rstd)``), with the same shapes and
  dtypes. It must not modify its inputs, and must not return an input or memory it did not write.
* ``cpp`` and ``cuda`` sources are C++/CUDA compiled with ``torch.utils.cpp_extension.load_inline``
  (``functions=["forward"]``; pybind passes arguments positionally: use ``torch::Tensor``,
  ``int64_t``, ``double``, ``bool``, ``std::vector<int64_t>``, ``c10::optional<torch::Tensor>``).
  ``triton`` sources are Python modules with ``@triton.jit`` kernels and a Python ``forward``.

For a whole captured module the contract is KernelBench's: a Python source defining
``class ModelNew(nn.Module)`` built with the captured module's constructor arguments, whose
``forward`` takes the captured inputs; captured weights are loaded into it by parameter name.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

BackendName = Literal["cpp", "cuda", "triton"]

# C++ keywords (and alternative operator spellings) an entry point's parameter cannot be named:
# a parameter named like one gets a trailing underscore (``default`` -> ``default_``).
CPP_KEYWORDS = frozenset({
    "and", "auto", "bool", "break", "case", "char", "class", "const", "continue", "default", "delete", "do", "double",
    "else", "enum", "explicit", "extern", "float", "for", "friend", "goto", "if", "inline", "int", "long", "mutable",
    "namespace", "new", "not", "operator", "or", "private", "protected", "public", "register", "return", "short",
    "signed", "sizeof", "static", "struct", "switch", "template", "this", "typename", "union", "unsigned", "using",
    "virtual", "void", "volatile", "while", "xor",
})


class KernelSource(BaseModel):
    backend: BackendName
    source: str = Field(description="Full source text: C++/CUDA for cpp and cuda, Python for triton.")
    entry: str = Field("forward", description="Name of the entry point the harness calls.")
    family: str | None = Field(None, description="Template family, when the source came from a template.")
    params: dict[str, Any] = Field(default_factory=dict, description="Template parameters (block sizes, ...).")
    provider: str = Field("agent", description="template, anthropic, sampling or agent.")
    provenance: dict[str, Any] = Field(
        default_factory=dict,
        description="Where it came from: model, prompt_sha256, input/output tokens, cost_usd, template, parent.",
    )

    @property
    def sha256(self) -> str:
        return hashlib.sha256(f"{self.backend}\0{self.entry}\0{self.source}".encode()).hexdigest()


SOURCE_SUFFIXES = (".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".cu", ".cuh", ".py")
MAX_SOURCE_BYTES = 1 << 20


def read_source_file(path: Path) -> str:
    """The text of a kernel source file. Only files named like sources (``.cpp``, ``.cu``, ``.py``,
    ...) of at most 1 MiB are read: a tool that takes a path from an MCP client must not become a
    way to read (and echo back in compile errors) any file of the server's machine."""
    from modulelens.errors import ModuleLensError

    if path.suffix.lower() not in SOURCE_SUFFIXES:
        raise ModuleLensError(f"{path.name!r} is not named like a kernel source",
                              "kernel sources end in " + ", ".join(SOURCE_SUFFIXES))
    try:
        if path.stat().st_size > MAX_SOURCE_BYTES:
            raise ModuleLensError(f"{path.name!r} is larger than 1 MiB", "a kernel source is a single small file")
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ModuleLensError(f"cannot read {path.name!r}: {type(e).__name__}", "give a readable text file") from None
