from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TRAIN = EXAMPLES / "tinyformer" / "train.py"

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Without a GPU, triton kernels run under the interpreter; the variable must be set before triton is
# first imported (torch imports it lazily, e.g. when a TorchDispatchMode is first used).
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def app():
    from modulelens.cli.app import build_app
    from modulelens.tools import all_tools

    return build_app(all_tools())


@pytest.fixture
def cli(app):
    """Run the CLI in-process; returns (exit_code, parsed JSON or None, result)."""
    runner = CliRunner()

    def run(*args: str):
        result = runner.invoke(app, [str(a) for a in args])
        data = None
        if "--json" in args:
            try:
                data = json.loads(result.stdout)
            except json.JSONDecodeError:
                data = None
        return result.exit_code, data, result

    return run


def run_cli_subprocess(*args: str, env: dict | None = None, timeout: float = 600):
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "modulelens", *map(str, args)], capture_output=True, text=True,
        timeout=timeout, env={**os.environ, **(env or {})},
    )


def full_report(reply):
    """The stored validation report behind a validate_kernel reply: every check, every isolation
    layer's detail and the wrapper evidence (the reply leaves those out). The reply itself when it
    cut nothing."""
    from modulelens.validation.report import ValidationReport

    full = next((c.full for c in reply.left_out if c.field in ("isolation.layers.detail", "wrapper_evidence")), None)
    return reply if full is None else ValidationReport.model_validate_json(Path(full).read_text(encoding="utf-8"))


def wait_until(predicate, timeout: float, what: str) -> None:
    """Return once ``predicate()`` is true; fail naming ``what`` after ``timeout`` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def softmax_card(tmp_path_factory):
    """(repository, card id) of the softmax operator card of a captured nn.Softmax on [16, 24]."""
    import modulelens
    from modulelens.registry import ToolContext
    from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops

    repo = tmp_path_factory.mktemp("softmax-repo")
    with modulelens.capture("", name="sm", repo=repo, export=False):
        torch.nn.Softmax(dim=-1)(torch.randn(16, 24))
    ops = capture_ops(CaptureOpsRequest(ref="sm", repeats=3), ToolContext(repo_root=repo))
    return repo, next(c.card_id for c in ops.cards if "softmax" in c.op)


class TanhScale(torch.nn.Module):
    """``tanh(x) * weight``: the small module most module-candidate tests validate against (a
    pointwise op and a parameter, weights that differ per column so a candidate ignoring them fails)."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, x):
        return torch.tanh(x) * self.weight


class CloneInput(torch.nn.Module):
    """``x.clone()``: a module whose candidates must return fresh memory."""

    def forward(self, x):
        return x.clone()


def capture_tanh_scale(repo: Path, name: str = "scale", dim: int = 16, batch: int = 8) -> None:
    """Capture one call of :class:`TanhScale` of width ``dim`` on a ``[batch, dim]`` input as ``name``."""
    import modulelens

    with modulelens.capture("", name=name, repo=repo, export=False):
        TanhScale(dim)(torch.randn(batch, dim))


@pytest.fixture(scope="session")
def scale_repo(tmp_path_factory):
    """A repository holding ``scale`` (a :class:`TanhScale` of width 16 on [8, 16]) and ``copy``
    (a module returning ``x.clone()`` on [8, 16]); tests validate candidates for them, one
    repository for the session."""
    import modulelens

    repo = tmp_path_factory.mktemp("scale-repo")
    capture_tanh_scale(repo)
    with modulelens.capture("", name="copy", repo=repo, export=False):
        CloneInput()(torch.randn(8, 16))
    return repo


def validate_source(repo: Path, source: str, target: str = "scale", **settings):
    """The ``validate_kernel`` reply for candidate ``source`` against ``target`` in ``repo``: one
    seed and no timing unless ``settings`` say otherwise."""
    from modulelens.registry import ToolContext
    from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel

    req = ValidateKernelRequest(source_text=source, target=target, **{"seeds": 1, "time": False, **settings})
    return validate_kernel(req, ToolContext(repo_root=repo))
