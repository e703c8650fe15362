"""Inputs that share memory replay as they ran: overlapping views of one buffer (an in-place write
to one reaches the other), broadcast (stride-0) views, and a relation that cannot be rebuilt is named
in the capture's notes. By source, by export and by the standalone repro."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import modulelens
from modulelens.capture import LoadedCapture
from alias_block import Shifted
from modulelens.repo import Repository


def _capture(repo, name, grad):
    torch.manual_seed(0)
    with modulelens.capture("block", name=name, repo=repo, backward=grad):
        net = Shifted(grad)
        for _ in range(2):  # the second step ends the capture
            out = net(torch.randn(1, 9), torch.randn(4))
            if grad:
                out.sum().backward()
    return LoadedCapture(Repository(repo).open("captures", name))


@pytest.fixture(scope="module")
def alias_repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("alias-repo")
    return repo, _capture(repo, "alias", grad=False), _capture(repo, "alias-grad", grad=True)


def test_the_capture_records_which_inputs_share_memory(alias_repo):
    _, loaded, _ = alias_repo
    x, y, e = loaded.manifest.inputs.tensor_leaves()
    assert x.storage.id == y.storage.id != e.storage.id
    assert (x.storage.offset, y.storage.offset, x.storage.span) == (0, 1, 9)
    assert e.stride == [0, 1] and (e.storage.offset, e.storage.span) == (0, 4)
    args, _ = loaded.inputs()
    args[0].add_(1.0)  # the rebuilt x and y share memory as in the run
    assert args[1][0, 0] == args[0][0, 1] and args[2].stride() == (0, 1)


@pytest.mark.parametrize("name", ["alias", "alias-grad"])
def test_overlapping_and_broadcast_inputs_replay_exactly_by_source_and_export(alias_repo, name):
    repo = alias_repo[0]
    for strategy in ("source", "export"):
        rep = modulelens.replay_module(name, strategy=strategy, repo=str(repo))
        assert rep.match and rep.exact and rep.max_abs_error == 0.0, (strategy, rep.notes, rep.outputs, rep.state)
        assert {s.name for s in rep.state} >= {"args.0", "args.1"}  # y changed through x
        assert all(s.max_abs_error == 0.0 for s in rep.state)


def test_the_gradients_of_overlapping_activations_replay_exactly(alias_repo):
    repo = alias_repo[0]
    rep = modulelens.replay_module("alias-grad", strategy="source", backward=True, repo=str(repo))
    assert rep.backward_match and {b.name for b in rep.backward} >= {"grad_input.1"}, rep.backward


def test_the_standalone_repro_rebuilds_the_shared_memory(alias_repo, tmp_path):
    repo = alias_repo[0]
    for flavor in ("source", "export"):
        out = modulelens.export_repro("alias", flavor=flavor, out=str(tmp_path / flavor), repo=str(repo))
        assert out.verified and out.max_abs_error == 0.0, out.check_output


class ReadsBoth(nn.Module):
    def forward(self, a, bits):
        return a * 2, bits + 1


def test_memory_shared_as_another_element_type_is_named_in_the_notes(tmp_path):
    buf = torch.randn(2, 4)
    with modulelens.capture("", name="views", repo=tmp_path, export=False):
        ReadsBoth()(buf, buf.view(torch.int32))
    notes = modulelens.show_capture("views", repo=str(tmp_path)).notes
    assert any("args.1" in n and "args.0" in n and "separate copies" in n for n in notes), notes
    rep = modulelens.replay_module("views", strategy="source", repo=str(tmp_path))
    assert rep.match and rep.exact


@pytest.fixture
def views_out(tmp_path):
    from alias_block import HoldsViewsOut

    torch.manual_seed(0)
    with modulelens.capture("block", name="views", repo=tmp_path):
        net = HoldsViewsOut()
        for _ in range(2):
            net(torch.randn(3, 4))
    return tmp_path


def test_outputs_keep_their_layout_and_a_replay_laid_out_otherwise_is_named(views_out, cli, monkeypatch):
    from alias_block import ViewsOut

    manifest = LoadedCapture(Repository(views_out).open("captures", "views")).manifest
    y, row, yt = manifest.output_leaves()
    assert y.storage.id == row.storage.id == yt.storage.id and yt.stride == [1, 4]
    code, data, r = cli("replay-module", "views:v1", "--strategy", "source", "--repo", views_out, "--json")
    assert code == 0 and data["exact"], r.output
    assert not [n for n in data["notes"] if n.startswith("output layout")]
    monkeypatch.setattr(ViewsOut, "copies", True)
    code, data, r = cli("replay-module", "views:v1", "--strategy", "source", "--repo", views_out, "--json")
    assert code == 0 and data["exact"], r.output  # the same values...
    layout = [n for n in data["notes"] if n.startswith("output layout")]  # ...laid out otherwise, named
    assert any("output.2 has strides [3, 1] in the replay, [1, 4] in the run" in n for n in layout), layout
    assert any("shared memory differs" in n and "output.0 = output.1 = output.2" in n for n in layout), layout


def test_the_capture_records_the_processor_it_ran_on(views_out):
    from modulelens.device import processor_name

    env = LoadedCapture(Repository(views_out).open("captures", "views")).manifest.environment
    assert env.processor == processor_name("cpu") and env.processor
