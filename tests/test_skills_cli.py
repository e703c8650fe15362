"""The skills' CLI examples against the CLI itself, so the skill text cannot drift from it: every
``modulelens ...`` command line in a skill (code blocks and inline code) names a real command and
parses with its options and arguments, and the isolate-module walkthrough runs, line by line, on
the example model (its ``tag-capture attn1:v3`` example once failed when only v1 existed)."""

from __future__ import annotations

import re
import shlex

import pytest
from conftest import TRAIN

from modulelens.tools.install_skills import available_skills

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
INLINE = re.compile(r"`(modulelens [^`\n]+)`")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_:0-9]*$")  # REF, DIR, SEARCH_ID, HEAD:6379 ...


def command_lines(text: str) -> list[list[str]]:
    """Every ``modulelens`` command line of a skill, in text order, as argv without ``modulelens``
    (comments dropped)."""
    found: list[tuple[int, str]] = []
    blocks = list(FENCE.finditer(text))
    for block in blocks:
        offset = block.start(1)
        for line in block.group(1).splitlines(keepends=True):
            if line.startswith("modulelens "):
                found.append((offset, line))
            offset += len(line)
    for m in INLINE.finditer(text):
        if not any(b.start() <= m.start() < b.end() for b in blocks):
            found.append((m.start(), m.group(1)))
    return [shlex.split(line, comments=True)[1:] for _, line in sorted(found)]


SKILL_LINES = [(name, argv) for name, path in available_skills().items()
               for argv in command_lines(path.read_text(encoding="utf-8"))]


def test_the_skills_hold_command_lines():
    per_skill = {name for name, _ in SKILL_LINES}
    assert per_skill == set(available_skills()), "every skill shows at least one CLI command"
    assert len(SKILL_LINES) >= 20


@pytest.mark.parametrize("skill, argv", SKILL_LINES, ids=[f"{n}:{' '.join(a)[:60]}" for n, a in SKILL_LINES])
def test_every_skill_command_line_parses(app, skill, argv):
    group = app
    assert argv and argv[0] in group.commands, f"{skill}: no command {argv[:1]} (commands: {sorted(group.commands)})"
    command = group.commands[argv[0]]
    try:
        command.make_context(argv[0], argv[1:])
    except Exception as e:  # noqa: BLE001 - the CLI's usage errors, whatever click flavour raises them
        pytest.fail(f"{skill}: `modulelens {shlex.join(argv)}` does not parse: {e}")


def _runnable_isolate_lines() -> list[list[str]]:
    text = available_skills()["isolate-module"].read_text(encoding="utf-8")
    # The handover section needs a W&B server (its lines are still parsed by the test above).
    text = re.split(r"^## .*handover.*$", text, flags=re.MULTILINE | re.IGNORECASE)[0]
    lines = command_lines(text)
    return [argv for argv in lines if argv[0] != "mcp" and not any(PLACEHOLDER.match(a) for a in argv)]


@pytest.mark.slow
def test_isolate_module_walkthrough_runs_on_the_example(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MODULELENS_HOME", str(tmp_path / "repo"))  # the lines as written, no --repo added
    lines = _runnable_isolate_lines()
    assert [a[0] for a in lines] == ["capture-module", "replay-module", "tag-capture", "list", "show",
                                     "export-repro"]
    for argv in lines:
        argv = [str(TRAIN) if a == "train.py" else a for a in argv]
        code, _, result = cli(*argv)
        assert code == 0, f"`modulelens {shlex.join(argv)}` failed:\n{result.output}"
    assert (tmp_path / "repros").is_dir()


def test_command_lines_are_found_in_blocks_and_inline_code():
    text = ("Run `modulelens tag-capture a:v1 good` then:\n\n```bash\nmodulelens list-captures   # all\n"
            "python x.py\n```\nand `modulelens show-capture a`.\n")
    assert command_lines(text) == [["tag-capture", "a:v1", "good"], ["list-captures"], ["show-capture", "a"]]
