"""A call replays under the numeric settings it ran with: PyTorch's process-wide switches (oneDNN,
TF32, matmul precision, deterministic algorithms) change which kernel computes a convolution and so
its last bits. A capture records them; the replay runs under them, restores the process's own, and
says what it changed."""

from __future__ import annotations

import torch
import torch.nn as nn

import modulelens
from modulelens.registry import ToolContext
from modulelens.repo import Repository
from modulelens.capture import capture_manifest
from modulelens.tools import get_tool


class ConvBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3)

    def forward(self, x):
        return self.conv(x).relu()


def test_a_call_captured_without_onednn_replays_exactly_in_a_process_that_uses_it(tmp_path):
    torch.manual_seed(0)
    net = ConvBlock()
    torch.backends.mkldnn.enabled = False
    try:
        with modulelens.capture("", name="conv", repo=tmp_path):
            for _ in range(2):  # the second call ends the capture
                net(torch.randn(2, 8, 16, 16))
    finally:
        torch.backends.mkldnn.enabled = True
    manifest = capture_manifest(Repository(tmp_path).open("captures", "conv"))
    assert manifest.environment.numerics["mkldnn"] is False

    replay = get_tool("replay_module")
    rep = replay(replay.request(ref="conv"), ToolContext(repo_root=tmp_path))
    assert rep.exact and rep.max_abs_error == 0.0, (rep.max_abs_error, rep.notes)
    assert any("numeric settings: mkldnn False (this process: True)" in n for n in rep.notes), rep.notes
    assert torch.backends.mkldnn.enabled is True  # the process's own setting is back
