"""Modules called with a key/value cache, as transformers models call their layers by default
(``use_cache=True``, also in training): a tiny random-initialised GPT-2 and Llama built in code,
captured by the Python API and from an unmodified script run.

The cache is an argument object the forward grows. The capture records it as it was before the
call; every run of the rebuilt module (replay, and the repeated runs capture_ops makes to record and
time the operators) gets its own copy of that cache, and the cache the replay grew is compared with
the captured one. One repository and four captures are shared by the module (about 15 s).
"""

from __future__ import annotations

import pytest
import torch

import modulelens
from conftest import EXAMPLES
from modulelens.capture import capture_manifest
from modulelens.repo import Repository

transformers = pytest.importorskip("transformers")

TRAIN = EXAMPLES / "transformers_tiny" / "train.py"
VOCAB, LENGTH = 64, 16


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=0)
    return transformers.LlamaForCausalLM(cfg)


# case -> (how it is captured, model, target layer, the key of the cache argument in the layer's call)
CASES = {
    "gpt2-api": ("api", _gpt2, "transformer.h.1", "args.1"),
    "llama-api": ("api", _llama, "model.layers.1", "kwargs.cache"),
    "gpt2-script": ("script", "gpt2", "transformer.h.1", "args.1"),
    "llama-script": ("script", "llama", "model.layers.1", "kwargs.cache"),
}


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """(repository, case -> capture ref): one training step each, with the default use_cache=True."""
    repo = tmp_path_factory.mktemp("cache-repo")
    refs = {}
    for case, (how, model, target, _) in CASES.items():
        if how == "api":
            torch.manual_seed(0)
            with modulelens.capture(target, name=case, repo=repo) as cap:
                ids = torch.randint(0, VOCAB, (2, LENGTH))
                model().train()(input_ids=ids, labels=ids)
            refs[case] = cap.artifact.ref
        else:
            done = modulelens.capture_module(str(TRAIN), module=target, name=case, repo=str(repo),
                                             script_args=["--model", model, "--steps", "1", "--lengths", str(LENGTH)])
            refs[case] = done.ref
    return repo, refs


@pytest.mark.parametrize("case", list(CASES))
def test_the_cache_is_recorded_as_it_was_before_the_call(cached, case):
    repo, refs = cached
    cache = CASES[case][3]
    man = capture_manifest(Repository(repo).open("captures", refs[case]))
    given = {s.key: s.shape for s in man.inputs.tensor_leaves()}
    # layer 0 had filled its entry of the cache before layer 1 was called; layer 1's was still empty
    assert given[f"{cache}.layers.0.keys"][-2] == LENGTH and f"{cache}.layers.1.keys" not in given, given
    grown = {k: v for k, v in man.state_after.items() if k.startswith(f"{cache}.layers.1.")}
    assert sorted(grown) == [f"{cache}.layers.1.keys", f"{cache}.layers.1.values"], man.state_after


@pytest.mark.parametrize("case", list(CASES))
def test_replay_grows_its_own_copy_of_the_cache_exactly(cached, case):
    repo, refs = cached
    cache = CASES[case][3]
    for strategy in ("source", "export"):
        rep = modulelens.replay_module(refs[case], strategy=strategy, repo=str(repo))
        assert rep.match and rep.exact and rep.max_abs_error == 0.0, (strategy, rep.notes, rep.outputs, rep.state)
        grown = {s.name: s for s in rep.state}
        assert sorted(grown) == [f"{cache}.layers.1.keys", f"{cache}.layers.1.values"], (strategy, rep.state)
        assert all(s.shape[-2] == LENGTH and s.max_abs_error == 0.0 for s in grown.values()), (strategy, rep.state)


@pytest.mark.parametrize("case", ["gpt2-api", "llama-script"])
def test_capture_ops_runs_the_layer_again_and_again_each_time_on_the_cache_as_captured(cached, case):
    """Recording and timing the operators runs the layer many times: each run must start from the
    cache as it was before the captured call, not as the previous run left it (the attention would
    see twice the keys its mask covers)."""
    repo, refs = cached
    ops = modulelens.capture_ops(refs[case], repeats=3, backward=True, top=100, repo=str(repo))
    assert {c.phase for c in ops.cards} == {"forward", "backward"} and ops.repeats == 3, ops.notes


def test_profile_times_every_call_from_the_cache_as_captured(cached):
    repo, refs = cached
    prof = modulelens.profile(refs["gpt2-api"], min_run_time=0.05, warmup=1, limit=100, repo=str(repo))
    assert "rebuilt before every call, untimed" in prof.what and "args.1.layers.1.keys" in prof.what, prof.what
    assert prof.runs >= 10 and "untimed setup" in prof.timer
    # the attention scores of every profiled call: 16 queries against 16 keys, never the keys of an earlier call
    scores = [o for o in prof.breakdown if o.op == "aten::matmul"]
    assert scores and all("32" not in o.input_shapes for o in scores), scores
