"""Shared by the benchmark scripts: print a Markdown report and keep it under benchmarks/results/."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def publish(name: str, lines: list[str]) -> None:
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.md").write_text(text + "\n")
