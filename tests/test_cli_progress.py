"""Progress while a tool works, through the CLI (click's runner: stdout and stderr are not
terminals): plain lines on stderr after the first second, a heartbeat for silent tools, nothing
with --json or --quiet, a live display when the console is a terminal."""

from __future__ import annotations

import json
import re
import time

import pytest
from pydantic import BaseModel, Field
from click.testing import CliRunner

from modulelens.cli.app import build_app
from modulelens.cli.progress import ProgressMode, progress_line, progress_mode
from modulelens.errors import ModuleLensError
from modulelens.registry import Tool, ToolContext


class WaitRequest(BaseModel):
    seconds: float = Field(0.0, description="How long each step waits.")
    steps: int = Field(2, description="Steps that report progress (0: report nothing).")
    fail: bool = Field(False, description="Raise at the end.")


class WaitResult(BaseModel):
    steps: int


def _wait(req: WaitRequest, ctx: ToolContext) -> WaitResult:
    if not req.steps:
        time.sleep(req.seconds)
    for i in range(req.steps):
        ctx.progress(i, req.steps, f"step {i + 1}")
        time.sleep(req.seconds)
    if req.fail:
        raise ModuleLensError("gave up", "try again")
    return WaitResult(steps=req.steps)


APP = build_app([Tool("wait", WaitRequest, WaitResult, _wait, "Waits.", render=lambda r: f"waited {r.steps} steps")])
LINE = re.compile(r"^wait: (step \d|working) \[(\d/\d, )?\d+ s\]$")


def _invoke(*args: str, env: dict[str, str] | None = None):
    # Not a terminal, whatever the environment running the tests says (None unsets a variable).
    return CliRunner().invoke(APP, ["wait", *args], env={"FORCE_COLOR": None, "TTY_INTERACTIVE": None, **(env or {})})


def test_plain_lines_on_stderr_after_a_second():
    r = _invoke("--seconds", "0.8", "--steps", "2")
    assert r.exit_code == 0, r.output
    assert r.stdout == "waited 2 steps\n"
    lines = r.stderr.splitlines()
    assert lines[-1].startswith("wait: done in ")
    assert all(LINE.match(line) for line in lines[:-1]), lines
    assert any(re.match(r"wait: step 2 \[1/2, \d+ s\]$", line) for line in lines)  # past the first second


def test_a_silent_tool_gets_a_heartbeat():
    r = _invoke("--seconds", "3.4", "--steps", "0")
    assert r.exit_code == 0, r.output
    lines = r.stderr.splitlines()
    assert len(lines) >= 3 and all(re.match(r"wait: working \[\d+ s\]$", line) for line in lines[:-1]), lines
    assert lines[0] in ("wait: working [1 s]", "wait: working [2 s]")
    assert re.match(r"wait: done in \d+ s$", lines[-1])


def test_short_waits_show_nothing():
    r = _invoke("--seconds", "0.1", "--steps", "3")
    assert r.exit_code == 0 and r.stderr == "", r.stderr


@pytest.mark.parametrize("flag", ["--json", "--quiet", "-q"])
def test_json_and_quiet_show_no_progress(flag):
    r = _invoke("--seconds", "0.7", "--steps", "2", flag)
    assert r.exit_code == 0, r.output
    assert r.stderr == ""
    if flag == "--json":
        assert json.loads(r.stdout) == {"steps": 2}
    else:
        assert r.stdout == "waited 2 steps\n"


def test_a_failure_ends_the_progress_before_the_error():
    r = _invoke("--seconds", "0.7", "--steps", "2", "--fail")
    assert r.exit_code == 2
    lines = r.stderr.splitlines()
    assert lines[-2:] == ["error: gave up", "hint: try again"]
    assert lines[:-2] and all(LINE.match(line) for line in lines[:-2]), lines  # no "done in" line


def test_live_display_on_a_terminal_leaves_only_the_result():
    r = _invoke("--seconds", "0.8", "--steps", "2", env={"FORCE_COLOR": "1", "TERM": "xterm", "TTY_INTERACTIVE": "1"})
    assert r.exit_code == 0, r.output
    assert re.sub(r"\x1b\[[0-9;]*m", "", r.stdout) == "waited 2 steps\n"
    assert "wait: step" in r.stderr and "\x1b[" in r.stderr  # drawn with rich, then cleared
    assert "done in" not in r.stderr


def test_progress_mode_and_line():
    assert progress_mode(quiet=True, as_json=False) is ProgressMode.OFF
    assert progress_mode(quiet=False, as_json=True) is ProgressMode.OFF
    assert progress_line("validate-kernel", "compile", 1, 5, 3.2) == "validate-kernel: compile [1/5, 3 s]"
    assert progress_line("capture-ops", None, 0, None, 12.6) == "capture-ops: working [13 s]"
    assert progress_line("profile", "done", 1, 1, 2) == "profile: done [2 s]"


def test_the_profilers_own_lines_do_not_break_the_profile_progress_line(app, tmp_path, capfd):
    """torch.profiler's C++ log lines (``USDT:... profiler_start``) go straight to file descriptor
    2, past the progress display; ``profile`` holds them off stderr, and its progress lines stay
    whole."""
    from conftest import capture_tanh_scale

    capture_tanh_scale(tmp_path, "sm")
    capfd.readouterr()
    r = CliRunner().invoke(app, ["profile", "sm", "--min-run-time", "1.2", "--warmup", "1",
                                 "--repo", str(tmp_path)])
    assert r.exit_code == 0, r.output
    native = capfd.readouterr().err  # what reached fd 2 itself, past sys.stderr
    assert "profiler_start" not in native and "Completed Stage" not in native, native
    assert "profiler_start" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines and all(line.startswith("profile: ") for line in lines), r.stderr
