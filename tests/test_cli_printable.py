"""Text from captures, scripts and candidates (notes, errors, reasons) can hold terminal control
sequences; the CLI shows them as visible escapes and never sends them to the terminal."""

from __future__ import annotations

from pydantic import BaseModel, Field
from click.testing import CliRunner

from modulelens.capture import CaptureSummary
from modulelens.cli.app import build_app
from modulelens.cli.formats import printable
from modulelens.errors import ModuleLensError
from modulelens.registry import Tool

HOSTILE = "ok\x1b[2J\x1b]0;owned\x07\x9b31m"


class Req(BaseModel):
    fail: bool = Field(False, description="Raise instead of returning.")


def _summary(req: Req, ctx) -> CaptureSummary:
    if req.fail:
        raise ModuleLensError(f"bad {HOSTILE}", f"hint {HOSTILE}")
    return CaptureSummary(ref="x:v1", name="x", version=1, module_path="m", class_path="a:B", call_index=1, training=False,
                          strategies=["source"], inputs=[], outputs=[], weights=0, notes=[HOSTILE],
                          unrecorded=[HOSTILE], path="/tmp/x")


def test_printable_escapes_control_characters_only():
    assert printable("tab\tand\nnewline é ✓") == "tab\tand\nnewline é ✓"
    assert printable("\x1b[31m\x07\x7f\x9b") == "\\x1b[31m\\x07\\x7f\\x9b"


def test_notes_and_errors_reach_the_terminal_escaped():
    app = build_app([Tool("show_it", Req, CaptureSummary, _summary, "Show.")], rich_help=False)
    r = CliRunner().invoke(app, ["show-it"])
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\x07" not in r.output and "\x9b" not in r.output
    assert "ok\\x1b[2J" in r.output
    r = CliRunner().invoke(app, ["show-it", "--fail"])
    assert r.exit_code == 2
    assert "\x1b" not in r.stderr and "bad ok\\x1b[2J" in r.stderr and "hint ok\\x1b" in r.stderr
