"""The CLI for people on a real repository (the example block and its operator cards, captured
once for this module): tables at 80 columns keep every id whole, colours and boxes only on a
terminal, progress lines from a validation without a terminal and none with --json."""

from __future__ import annotations

import json
import re

import pytest
from conftest import TRAIN
from rich.cells import cell_len
from click.testing import CliRunner

pytestmark = pytest.mark.slow

NARROW = {"COLUMNS": "80", "FORCE_COLOR": None, "NO_COLOR": None}  # 80 columns, not a terminal (None: unset)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
COLOUR = re.compile(r"\x1b\[[0-9;]*(3[0-7]|9[0-7]|38;)[0-9;]*m")


@pytest.fixture(scope="module")
def demo(tmp_path_factory, app):
    """The demo's capture (blocks.1 of the example transformer as demo-block) and its cards."""
    repo = tmp_path_factory.mktemp("cli-repo")
    runner = CliRunner()
    r = runner.invoke(app, ["capture-module", str(TRAIN), "--module", "blocks.1", "--name", "demo-block",
                            "--repo", str(repo), "--json", "--", "--steps", "2"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["capture-ops", "demo-block", "--top", "100", "--repo", str(repo), "--json"])
    assert r.exit_code == 0, r.output
    return repo, json.loads(r.stdout)


def _run(app, *args, env=None):
    r = CliRunner().invoke(app, [str(a) for a in args], env=env)
    assert r.exit_code == 0, r.output
    return r


def _whole(token: str, line: str) -> bool:
    return re.search(rf"(^|\s){re.escape(token)}(\s|$)", line) is not None


def _row(text: str, *tokens: str) -> str:
    """The one line that holds every token whole."""
    rows = [line for line in text.splitlines() if all(_whole(t, line) for t in tokens)]
    assert len(rows) == 1, (tokens, text)
    return rows[0]


def _fits(text: str, width: int = 80) -> None:
    assert all(cell_len(line) <= width for line in text.splitlines()), text


def test_card_table_at_80_columns_keeps_every_id_and_op_whole(app, demo):
    repo, cards = demo
    r = _run(app, "list", "cards", "demo-block", "--limit", "100", "--repo", repo, env=NARROW)
    _fits(r.stdout)
    for c in cards["cards"]:
        _row(r.stdout, c["card_id"], c["op"])  # one row per line, id and op whole on it
    assert not re.search("[─│┌└]", r.stdout) and not ANSI.search(r.stdout)  # not a terminal: plain


def test_capture_list_at_80_columns_keeps_every_ref_whole(app, demo):
    repo, _ = demo
    _run(app, "tag-capture", "demo-block:v1", "prod", "--repo", repo)
    r = _run(app, "list", "captures", "--repo", repo, env=NARROW)
    _fits(r.stdout)
    _row(r.stdout, "demo-block:v1", "blocks.1")


def test_wide_shows_every_column(app, demo):
    repo, cards = demo
    r = _run(app, "list", "cards", "demo-block", "--limit", "100", "--repo", repo, "--wide", env=NARROW)
    header = next(line for line in r.stdout.splitlines() if line.startswith("card"))
    assert header.split() == ["card", "op", "kind", "shapes", "dtypes", "calls", "time/run", "share", "roofline"]
    norm = next(c for c in cards["cards"] if c["op"] == "aten.native_layer_norm.default")
    assert "[8,32,64] [64] [64]" in _row(r.stdout, norm["card_id"], norm["op"])


def test_colour_and_boxes_only_on_a_terminal(app, demo):
    repo, _ = demo
    term = _run(app, "list", "cards", "demo-block", "--repo", repo, "--limit", "3", env={**NARROW, "FORCE_COLOR": "1"})
    assert COLOUR.search(term.stdout) and "─" in term.stdout
    no_colour = _run(app, "list", "cards", "demo-block", "--repo", repo, "--limit", "3",
                     env={**NARROW, "FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert not COLOUR.search(no_colour.stdout) and "─" in no_colour.stdout
    _fits(ANSI.sub("", term.stdout))


@pytest.mark.parametrize("command,of_card", [(["show", "capture"], False), (["replay-module"], False),
                                            (["show", "card"], True), (["replay-module"], True)])
def test_other_views_keep_ids_whole_at_60_columns(app, demo, command, of_card):
    repo, cards = demo
    card = cards["cards"][0]
    target = card["card_id"] if of_card else "demo-block:v1"
    r = _run(app, *command, target, "--repo", repo, env={**NARROW, "COLUMNS": "60"})
    _fits(r.stdout, 60)
    assert any(_whole(target, line) for line in r.stdout.splitlines()), r.stdout
    if of_card:
        assert any(_whole(card["op"], line) for line in r.stdout.splitlines()), r.stdout


def test_validation_shows_progress_lines_without_a_terminal_and_none_with_json(app, demo, monkeypatch):
    import modulelens.cli.progress as progress

    repo, cards = demo
    softmax = next(c["card_id"] for c in cards["cards"] if "softmax" in c["op"])
    gen = json.loads(_run(app, "generate-kernel", softmax, "--backend", "cpp", "--repo", repo, "--json").stdout)
    candidate = gen["candidate_id"]
    # A warm sandbox and build cache can validate in about a second; show progress from the start so
    # the test does not depend on the machine's speed (the one-second delay is tested with fake tools).
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    r = _run(app, "validate-kernel", candidate, "--repo", repo, env=NARROW)
    lines = [line for line in r.stderr.splitlines() if line.startswith("validate-kernel: ")]
    assert len(lines) >= 2, r.stderr
    assert all(re.match(r"validate-kernel: .+ \[(\d/6, )?\d+ s\]$", line) for line in lines[:-1]), lines
    assert re.match(r"validate-kernel: done in \d+ s$", lines[-1]), lines
    assert "validate-kernel:" not in r.stdout
    head = r.stdout.splitlines()[0]
    assert head.split()[:4] == ["custom", candidate, "for", softmax], r.stdout  # ids whole in the verdict
    _fits(r.stdout)

    r = _run(app, "validate-kernel", candidate, "--repo", repo, "--json")
    assert r.stderr == ""  # no progress (and nothing else) with --json
    assert json.loads(r.stdout)["verdict"] == "custom"
