"""Models as people run them: torch.compile, DDP, FSDP2's fully_shard (gloo on CPU), activation
checkpointing, a shared module called several times, autocast regions, parameters created on
``meta`` and materialised later. Each capture is named as in the plain model and replays exactly."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import modulelens
from modulelens.capture import capture_manifest


class Block(nn.Module):
    def __init__(self, d: int = 16, device=None):
        super().__init__()
        self.lin = nn.Linear(d, d, device=device)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(torch.relu(self.lin(x))) + x


class Net(nn.Module):
    def __init__(self, device=None):
        super().__init__()
        self.layers = nn.ModuleList([Block(device=device) for _ in range(2)])
        self.shared = Block(device=device)

    def forward(self, x):
        for layer in self.layers:
            x = self.shared(layer(x))
        return x


def _capture_and_replay(tmp_path, run, target="layers.1", call=1, strategies=("source", "export")):
    torch.manual_seed(0)
    with modulelens.capture(target, name="w", call=call, repo=tmp_path) as cap:
        run()
    man = capture_manifest(cap.artifact)
    assert man.module_path == target.removeprefix("type:")
    for strategy in strategies:
        rep = modulelens.replay_module("w", strategy=strategy, repo=str(tmp_path))
        assert rep.exact and rep.max_abs_error == 0.0, (strategy, rep.notes)
    return man


def test_torch_compile(tmp_path):
    _capture_and_replay(tmp_path, lambda: torch.compile(Net().train())(torch.randn(4, 16)))


def test_activation_checkpointing(tmp_path):
    from torch.utils.checkpoint import checkpoint

    def run():
        net = Net().train()
        x = torch.randn(4, 16, requires_grad=True)
        for layer in net.layers:  # each layer is called alone: it is still named within the model
            x = checkpoint(layer, x, use_reentrant=False)
        x.sum().backward()  # the recomputation sees the same number of saved tensors

    _capture_and_replay(tmp_path, run)


def test_shared_module_second_call(tmp_path):
    _capture_and_replay(tmp_path, lambda: Net().train()(torch.randn(4, 16)), target="shared", call=2)


def test_autocast_region_is_recorded_and_restored(tmp_path):
    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            Net().train()(torch.randn(4, 16))

    man = _capture_and_replay(tmp_path, run)
    assert man.autocast == {"cpu": "bfloat16"}  # without it the replay differs by about 5e-3


def test_parameters_created_on_meta_and_materialised_later(tmp_path):
    def run():
        net = Net(device="meta")
        net.to_empty(device="cpu")
        for p in net.parameters():
            nn.init.normal_(p)
        net(torch.randn(4, 16))

    _capture_and_replay(tmp_path, run)


@pytest.fixture
def process_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ddp_and_fsdp2(tmp_path, process_group):
    from torch.distributed.fsdp import fully_shard

    _capture_and_replay(tmp_path / "ddp", lambda: nn.parallel.DistributedDataParallel(Net().train())(torch.randn(4, 16)))

    def fsdp():
        net = Net().train()
        for layer in net.layers:
            fully_shard(layer)
        fully_shard(net)
        net(torch.randn(4, 16))

    man = _capture_and_replay(tmp_path / "fsdp", fsdp, strategies=("source",))
    assert all(not spec.get("layout") for spec in man.weights.values())  # stored as plain tensors
