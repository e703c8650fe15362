"""The UI's sections (the navigation bar), and the extension point for features still to come.

A section with a ``list_kind`` is *list-backed*: its page calls the ``list`` tool for that kind and
shows the result (lists of records as tables), or "none yet" while the repository holds none. A
feature that wants a richer page adds its own route and template and sets ``list_kind`` to None:
searches (the trees, stop and continue) and packs (entries, shape rules, hits, checks) do.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Section:
    key: str = ""
    title: str = ""
    href: str = "/"
    list_kind: str | None = None
    empty: str = ""


SECTIONS: tuple[Section, ...] = (
    Section("captures", "Captures", "/"),
    Section("cards", "Operator cards", "/cards"),
    Section("candidates", "Candidates", "/candidates"),
    Section("searches", "Searches", "/searches"),
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


def list_backed() -> list[Section]:
    """The sections whose page shows the ``list`` tool's result for their kind."""
    return [s for s in SECTIONS if s.list_kind is not None]
