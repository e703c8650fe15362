"""Prompt templates for kernel generation, one Markdown file per prompt.

``render(name, **fields)`` reads ``<name>.md`` from this package and fills its ``{field}``
placeholders with :meth:`str.format_map`. Literal braces in a template are written ``{{`` and
``}}``; values are inserted verbatim (braces in a value, such as C++ source, need no escaping).
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from modulelens.errors import ModuleLensError

__all__ = ["render", "template_text"]


@cache
def template_text(name: str) -> str:
    """The raw text of ``prompts/<name>.md``."""
    try:
        return resources.files(__name__).joinpath(f"{name}.md").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModuleLensError(f"no prompt template {name!r}", f"expected modulelens/prompts/{name}.md")


class _Fields(dict):
    def __init__(self, template: str, fields: dict[str, Any]):
        super().__init__(fields)
        self.template = template

    def __missing__(self, key: str) -> Any:
        raise ModuleLensError(
            f"prompt template {self.template}.md uses {{{key}}} but no value was given for it",
            f"pass {key}=... to render(); given: {', '.join(sorted(self)) or 'nothing'}",
        )


def render(name: str, **fields: Any) -> str:
    """``prompts/<name>.md`` with its ``{placeholders}`` filled from ``fields``."""
    return template_text(name).format_map(_Fields(name, fields)).strip() + "\n"
