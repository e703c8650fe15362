"""Simple syntax highlighting of kernel sources (C++, CUDA, Python/Triton) as escaped HTML.

One regular expression splits the source into comments, strings, preprocessor lines, numbers,
words and everything else; keywords and known types become ``<span class="tok-...">``. Every
piece of the source is escaped before it is wrapped, so the result is safe to insert in a page.
"""

from __future__ import annotations

import html
import re
from typing import Literal

from markupsafe import Markup

Language = Literal["cpp", "python"]

_C_KEYWORDS = frozenset("""
auto break case catch class const constexpr continue default delete do else enum explicit extern false for
friend goto if inline namespace new noexcept nullptr operator private protected public return sizeof static
static_assert static_cast reinterpret_cast const_cast dynamic_cast struct switch template this throw true try
typedef typename union using virtual volatile while __global__ __device__ __host__ __shared__ __restrict__
__syncthreads
""".split())
_C_TYPES = frozenset("""
bool char double float int long short signed unsigned void size_t int8_t int16_t int32_t int64_t uint8_t
uint16_t uint32_t uint64_t half dim3 at torch Tensor std vector optional
""".split())
_PY_KEYWORDS = frozenset("""
and as assert async await break class continue def del elif else except False finally for from global if import
in is lambda None nonlocal not or pass raise return True try while with yield
""".split())
_PY_TYPES = frozenset("tl triton torch int float bool str constexpr jit".split())

_C_TOKENS = re.compile(r"""
    (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<pre>^[ \t]*\#[^\n]*)
  | (?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
  | (?P<number>\b(?:0[xX][0-9a-fA-F]+|\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)[fFuUlL]*\b)
  | (?P<word>[A-Za-z_]\w*)
""", re.VERBOSE | re.DOTALL | re.MULTILINE)

_PY_TOKENS = re.compile(r"""
    (?P<comment>\#[^\n]*)
  | (?P<string>(?:[rbuRBU]|[fF][rR]?)?(?:\"\"\".*?\"\"\"|'''.*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
  | (?P<pre>^[ \t]*@[\w.]+)
  | (?P<number>\b(?:0[xX][0-9a-fA-F]+|\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)\b)
  | (?P<word>[A-Za-z_]\w*)
""", re.VERBOSE | re.DOTALL | re.MULTILINE)

_RULES = {
    "cpp": (_C_TOKENS, _C_KEYWORDS, _C_TYPES),
    "python": (_PY_TOKENS, _PY_KEYWORDS, _PY_TYPES),
}


def language_of(backend: str) -> Language:
    """The language of a backend's sources: Python for triton and module candidates (ModelNew), C++ for cpp and cuda."""
    return "python" if backend in ("triton", "module") else "cpp"


def _span(kind: str, text: str) -> str:
    return f'<span class="tok-{kind}">{html.escape(text)}</span>'


def highlight(source: str, language: Language) -> Markup:
    """``source`` as escaped HTML with highlighting spans (put it inside ``<pre><code>``)."""
    tokens, keywords, types = _RULES[language]
    out: list[str] = []
    pos = 0
    for m in tokens.finditer(source):
        out.append(html.escape(source[pos:m.start()]))
        kind, text = m.lastgroup or "", m.group()
        if kind == "word":
            out.append(_span("kw", text) if text in keywords else _span("type", text) if text in types
                       else html.escape(text))
        else:
            out.append(_span(kind, text))
        pos = m.end()
    out.append(html.escape(source[pos:]))
    return Markup("".join(out))
