"""KernelBench-style files (``Model``, ``get_inputs``, ``get_init_inputs``) of several shapes of
constructor arguments, each through capture, replay (auto and export) and its standalone repro run
from an empty folder with only torch and safetensors."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import textwrap

import pytest

import modulelens

FILES = {
    "positional": """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, in_features, out_features):
                super().__init__()
                self.linear = nn.Linear(in_features, out_features)

            def forward(self, x):
                return torch.relu(self.linear(x))

        def get_inputs():
            return [torch.randn(4, 16)]

        def get_init_inputs():
            return [16, 8]
    """,
    "many-scalars": """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, in_channels, out_channels, kernel_size, stride, padding, bias, slope, mode):
                super().__init__()
                self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=bias)
                self.slope, self.mode = slope, mode

            def forward(self, x):
                y = nn.functional.leaky_relu(self.conv(x), self.slope)
                return y.mean(dim=(2, 3)) if self.mode == "pool" else y

        def get_inputs():
            return [torch.randn(2, 3, 8, 8)]

        def get_init_inputs():
            return [3, 4, 3, 1, 1, False, 0.1, "pool"]
    """,
    "tensors": """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, scale, dim=6):
                super().__init__()
                self.register_buffer("scale", scale.clone())
                self.norm = nn.LayerNorm(dim)

            def forward(self, x, y):
                x.mul_(2)  # changes its input in place
                return self.norm(x) * self.scale + y

        def get_inputs():
            return [torch.randn(3, 6), torch.randn(3, 6)]

        def get_init_inputs():
            return [torch.linspace(0.5, 1.5, 6)]
    """,
    "none": """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.drop = nn.Dropout(0.3)

            def forward(self, a, b):
                return self.drop(torch.matmul(a, b)), a.sum()

        def get_inputs():
            return [torch.randn(5, 4), torch.randn(4, 3)]
    """,
}


@pytest.fixture(scope="module")
def kernelbench(tmp_path_factory):
    """Each file captured once (through the capture worker): case -> (repository, reference)."""
    root = tmp_path_factory.mktemp("kb")
    repo = root / "repo"
    refs = {}
    for case, text in FILES.items():
        path = root / f"{case.replace('-', '_')}.py"
        path.write_text(textwrap.dedent(text))
        refs[case] = modulelens.capture_module(str(path), name=case, repo=str(repo)).ref
    return repo, refs


def _run_alone(repro: str, data_dir: str, tmp_path) -> subprocess.CompletedProcess:
    """Copy the repro and its data folder into an empty folder and run it there, isolated."""
    alone = tmp_path / "alone"
    alone.mkdir(parents=True)
    shutil.copy(repro, alone)
    shutil.copytree(data_dir, alone / (data_dir.rsplit("/", 1)[-1]))
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    return subprocess.run([sys.executable, "-I", str(alone / repro.rsplit("/", 1)[-1])], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


@pytest.mark.parametrize("case", list(FILES))
def test_capture_replay_and_standalone_repro(kernelbench, case, tmp_path):
    repo, refs = kernelbench
    for strategy in ("auto", "export"):
        rep = modulelens.replay_module(refs[case], strategy=strategy, repo=str(repo))
        assert rep.exact and rep.max_abs_error == 0.0, (strategy, rep.notes, rep.outputs, rep.state)
    for flavor in ("auto", "export"):
        # the tool's own check runs the same file (covered with the transformers captures); here it runs alone
        written = modulelens.export_repro(refs[case], out=str(tmp_path / flavor), flavor=flavor, verify=False,
                                          repo=str(repo))
        assert flavor == "export" or written.flavor == "source"
        imports = {a.name.split(".")[0] for n in ast.walk(ast.parse(open(written.path).read()))
                   if isinstance(n, ast.Import) for a in n.names}
        imports |= {n.module.split(".")[0] for n in ast.walk(ast.parse(open(written.path).read()))
                    if isinstance(n, ast.ImportFrom) and n.module}
        assert imports <= {"torch", "safetensors", "math", "sys", "pathlib", "dataclasses", "contextlib"}, imports
        run = _run_alone(written.path, written.data_dir, tmp_path / f"run-{flavor}")
        assert run.returncode == 0 and "max_abs_error=0.0" in run.stdout, run.stdout + run.stderr


def test_the_inplace_change_to_an_input_is_compared(kernelbench):
    repo, refs = kernelbench
    rep = modulelens.replay_module(refs["tensors"], strategy="source", repo=str(repo))
    assert [s.name for s in rep.state] == ["args.0"] and rep.state[0].max_abs_error == 0.0


def test_a_repro_that_does_not_reproduce_is_an_error(kernelbench, tmp_path):
    repo, refs = kernelbench
    written = modulelens.export_repro(refs["positional"], out=str(tmp_path), verify=False, repo=str(repo))
    from safetensors.torch import load_file, save_file

    outputs = f"{written.data_dir}/outputs.safetensors"
    save_file({k: v + 1 for k, v in load_file(outputs).items()}, outputs)
    run = subprocess.run([sys.executable, "-I", written.path], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "does not reproduce the capture" in run.stderr
    from pathlib import Path

    from modulelens.capture import check_repro

    check = check_repro(Path(written.path))  # what export_repro turns into its error
    assert not check.verified and abs(check.max_abs_error - 1.0) < 1e-6 and "does not reproduce" in check.reason
