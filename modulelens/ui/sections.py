"""The UI's sections (the navigation bar), and the extension point for features still to come.

A section with a ``list_tool`` is *tool-backed*: its page calls that tool with its default request
and shows the result (lists of records as tables). Searches are declared this way: until a tool
named ``list_searches`` is registered the page says "none yet"; once the feature registers its
tool, the page shows its data with no change here. A feature that wants a richer page adds its own
route and template and sets ``list_tool`` to None (packs: ``list_packs`` on its own page).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Section:
    key: str = ""
    title: str = ""
    href: str = "/"
    list_tool: str | None = None
    empty: str = ""


SECTIONS: tuple[Section, ...] = (
    Section("captures", "Captures", "/"),
    Section("cards", "Operator cards", "/cards"),
    Section("candidates", "Candidates", "/candidates"),
    Section("searches", "Searches", "/searches", list_tool="list_searches",
            empty="No kernel searches yet: the optimize tool, when it lands, stores its search trees here."),
    Section("packs", "Packs", "/packs"),
    Section("stats", "Training statistics", "/stats"),
    Section("jobs", "Jobs", "/jobs"),
)


def section(key: str) -> Section:
    """The section named ``key`` (a KeyError for an unknown one: a programming error)."""
    for s in SECTIONS:
        if s.key == key:
            return s
    raise KeyError(key)


def tool_backed() -> list[Section]:
    """The sections whose page shows a list tool's result."""
    return [s for s in SECTIONS if s.list_tool is not None]
