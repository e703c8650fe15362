"""The one spelling of a kind of stored thing across the tools that take one (``list``, ``show``,
``push``, ``trust``): plural, as the repository's folders are named (``captures``, ``cards``,
``candidates``, ``searches``, ``stats``, ``packs``, ``reports``, ``opsets``). The singular
(``capture``, ``card``, ...) is accepted as an alias everywhere, over MCP and in the CLI, and read
as the plural; the schemas and the help list only the plural."""

from __future__ import annotations

from typing import Any

from pydantic import BeforeValidator

PLURAL_OF = {"capture": "captures", "opset": "opsets", "card": "cards", "candidate": "candidates",
             "search": "searches", "stat": "stats", "pack": "packs", "report": "reports"}


def plural_kind(value: Any) -> Any:
    """``value`` with a singular kind name read as its plural; anything else left for the field's
    own check (which names the choices)."""
    return PLURAL_OF.get(value, value) if isinstance(value, str) else value


AcceptSingular = BeforeValidator(plural_kind)  # Annotated[SomeKindLiteral, AcceptSingular]


def singular_aliases(choices: list[str]) -> dict[str, str]:
    """The singular aliases of those of ``choices`` that are kind names (for a CLI choice)."""
    return {one: many for one, many in PLURAL_OF.items() if many in choices and one not in choices}
