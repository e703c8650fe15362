"""Whether a kernel source was written for the operator of the card it is validated against, as far
as its entry point tells: ``forward`` takes the card operator's arguments in the order of the card's
stored sample (see :mod:`modulelens.kernels.source`), so an entry point that takes another number of
arguments was written for another operator (a ``layer_norm`` card named where a ``softmax`` kernel
was meant). Read before anything is stored or compiled, so that the mismatch is named as such, not
as the shape or call errors it would cause."""

from __future__ import annotations

import ast
import re

from modulelens.kernels.source import KernelSource
from modulelens.ops import OpCard

_CPP_ENTRY = r"\b{name}\s*\(([^()]*(?:\([^()]*\)[^()]*)*)\)\s*(?:const\s*)?\{{"


def entry_arity(src: KernelSource) -> tuple[int, float] | None:
    """(fewest, most) arguments the source's entry point takes (most is infinite with ``*args``);
    None when the entry point cannot be found or read (the validation then says what is wrong)."""
    if src.backend == "triton":
        return _python_arity(src.source, src.entry)
    match = re.search(_CPP_ENTRY.format(name=re.escape(src.entry)), _without_comments(src.source))
    if match is None:
        return None
    params = _top_level_split(match.group(1))
    if params == [] or params == ["void"]:
        return 0, 0
    defaults = sum(1 for p in params if "=" in p)
    return len(params) - defaults, len(params)


def _without_comments(text: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)


def _top_level_split(text: str) -> list[str]:
    """Parameters of a C++ parameter list: commas inside ``<>``, ``()`` and ``{}`` do not split."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "<({"
        depth -= ch in ">)}"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()] if any(p.strip() for p in parts) else []


def _python_arity(text: str, entry: str) -> tuple[int, float] | None:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry), None)
    if fn is None:
        return None
    a = fn.args
    positional = len(a.posonlyargs) + len(a.args)
    return positional - len(a.defaults), float("inf") if a.vararg else positional


def card_arity(card: OpCard) -> tuple[int, list[str]] | None:
    """(arguments the card's sample passes, their aten names); None for a card without a readable sample."""
    from modulelens.kernels.templates.call import NoMatch, call_from_card

    try:
        call = call_from_card(card)
    except (NoMatch, ValueError, TypeError, KeyError):
        return None
    return len(call.values), call.schema_names


def operator_mismatch(card: OpCard, src: KernelSource) -> str | None:
    """Why ``src`` was not written for ``card``'s operator (its entry point takes another number of
    arguments than the card's call passes), or None when the numbers agree or cannot be read."""
    arity, needed = entry_arity(src), card_arity(card)
    if arity is None or needed is None:
        return None
    low, high = arity
    count, names = needed
    if low <= count <= high:
        return None
    takes = f"{low}" if low == high else f"{low} to {'any number' if high == float('inf') else int(high)}"
    return (f"operator mismatch: card {card.card_id} is {card.op}, called with {count} argument(s) "
            f"({', '.join(names)}), but the source's {src.entry} takes {takes}: it was written for another operator")
