"""Capture and replay on transformers models nobody here wrote: tiny random-initialised configs
built in code (no downloads), in training mode with dropout, attention, MLP and whole-layer modules
of six architectures (an encoder-decoder with cross-attention among them) and a decoder called with
a cache. Every capture must replay exactly with the source and the export strategy."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import modulelens

transformers = pytest.importorskip("transformers")

VOCAB = 64


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.2)
    return transformers.LlamaForCausalLM(cfg)


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                                  attn_pdrop=0.2, resid_pdrop=0.2, embd_pdrop=0.2)
    return transformers.GPT2LMHeadModel(cfg)


def _bert():
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=48, max_position_embeddings=32,
                                  hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2)
    return transformers.BertModel(cfg)


def _t5():
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                                dropout_rate=0.2, decoder_start_token_id=0)
    return transformers.T5ForConditionalGeneration(cfg)


def _qwen2():
    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.2)
    return transformers.Qwen2ForCausalLM(cfg)


def _neox():
    cfg = transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, attention_dropout=0.2, hidden_dropout=0.2,
                                     max_position_embeddings=32)
    return transformers.GPTNeoXForCausalLM(cfg)


def _gemma3():
    # layer 1 attends through a sliding window; its mask arrives as a broadcast (stride-0) view
    cfg = transformers.Gemma3TextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
                                        attention_dropout=0.2, max_position_embeddings=32)
    return transformers.Gemma3ForCausalLM(cfg)


def _train_step(build: Callable[[], torch.nn.Module]) -> None:
    model = build().train()
    ids = torch.randint(0, VOCAB, (2, 7))
    if model.config.is_encoder_decoder:
        model(input_ids=ids, decoder_input_ids=ids[:, :5])
    else:
        model(input_ids=ids)


def _decode_with_cache(build: Callable[[], torch.nn.Module]) -> None:
    model = build().eval()
    ids = torch.randint(0, VOCAB, (2, 7))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        model(input_ids=ids[:, :1], cache=cache, use_cache=True)


# case -> (model builder, how it runs, target, call)
CASES = {
    "llama-attn": (_llama, _train_step, "model.layers.0.self_attn", 1),
    "llama-mlp": (_llama, _train_step, "model.layers.0.mlp", 1),
    "llama-layer": (_llama, _train_step, "model.layers.1", 1),
    "llama-layer-cached-decode": (_llama, _decode_with_cache, "model.layers.1", 2),
    "gpt2-attn": (_gpt2, _train_step, "transformer.h.0.attn", 1),
    "gpt2-mlp": (_gpt2, _train_step, "transformer.h.0.mlp", 1),
    "gpt2-layer": (_gpt2, _train_step, "transformer.h.1", 1),
    "bert-attn": (_bert, _train_step, "encoder.layer.0.attention", 1),
    "bert-mlp": (_bert, _train_step, "encoder.layer.0.intermediate", 1),
    "bert-layer": (_bert, _train_step, "encoder.layer.1", 1),
    "t5-self-attn": (_t5, _train_step, "encoder.block.0.layer.0.SelfAttention", 1),
    "t5-cross-attn": (_t5, _train_step, "decoder.block.1.layer.1.EncDecAttention", 1),
    "t5-mlp": (_t5, _train_step, "decoder.block.0.layer.2.DenseReluDense", 1),
    "t5-decoder-layer": (_t5, _train_step, "decoder.block.1", 1),
    "qwen2-attn": (_qwen2, _train_step, "model.layers.0.self_attn", 1),
    "qwen2-layer": (_qwen2, _train_step, "model.layers.1", 1),
    "neox-attn": (_neox, _train_step, "gpt_neox.layers.0.attention", 1),
    "neox-mlp": (_neox, _train_step, "gpt_neox.layers.0.mlp", 1),
    "neox-layer": (_neox, _train_step, "gpt_neox.layers.1", 1),
    "gemma3-attn": (_gemma3, _train_step, "model.layers.1.self_attn", 1),
}


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    """Every case captured once, in this process, into one repository: case -> reference."""
    repo = tmp_path_factory.mktemp("hf-repo")
    refs = {}
    for case, (build, run, target, call) in CASES.items():
        torch.manual_seed(0)
        with modulelens.capture(target, name=case, call=call, repo=repo) as cap:
            run(build)
        refs[case] = cap.artifact.ref
    return repo, refs


@pytest.mark.parametrize("case", list(CASES))
def test_source_and_export_replay_exactly(captures, case):
    repo, refs = captures
    for strategy in ("source", "export"):
        rep = modulelens.replay_module(refs[case], strategy=strategy, repo=str(repo))
        assert rep.match and rep.exact and rep.max_abs_error == 0.0, (strategy, rep.notes, rep.outputs, rep.state)


def test_the_cached_decode_compares_the_cache_it_grew(captures):
    repo, refs = captures
    rep = modulelens.replay_module(refs["llama-layer-cached-decode"], strategy="export", repo=str(repo))
    grown = [s for s in rep.state if s.name.endswith(("layers.1.keys", "layers.1.values"))]
    assert len(grown) == 2 and all(s.shape[-2] == 8 for s in grown)  # 7 prompt positions and the decoded one
    assert any("input tensor(s) the forward changed" in c for c in rep.compared_values)


def test_a_config_attribute_outside_its_fields_is_recorded(captures):
    from modulelens.capture import capture_manifest
    from modulelens.repo import Repository

    repo, refs = captures
    man = capture_manifest(Repository(repo).open("captures", refs["llama-attn"]))
    config = man.init.args[0] if man.init.args else man.init.kwargs["config"]
    assert config["fields"]["_attn_implementation_internal"] == "sdpa"


def test_gemma3_attention_mask_is_recorded_and_rebuilt_as_a_broadcast_view(captures, tmp_path):
    from modulelens.capture import LoadedCapture
    from modulelens.repo import Repository

    repo, refs = captures
    loaded = LoadedCapture(Repository(repo).open("captures", refs["gemma3-attn"]))
    mask = next(s for s in loaded.manifest.inputs.tensor_leaves() if s.key == "kwargs.attention_mask")
    assert mask.stride[0] == 0 and mask.storage is not None and mask.storage.span == 49  # one 7x7 mask, broadcast
    _, kwargs = loaded.inputs()
    assert kwargs["attention_mask"].stride() == tuple(mask.stride)
    out = modulelens.export_repro(refs["gemma3-attn"], out=str(tmp_path), repo=str(repo))
    assert out.verified and out.max_abs_error == 0.0
    assert "_shared(" in open(out.path).read()


def test_the_export_repro_runs_alone(captures, tmp_path):
    repo, refs = captures
    out = modulelens.export_repro(refs["llama-layer-cached-decode"], out=str(tmp_path), repo=str(repo))
    assert out.flavor == "export" and out.verified and out.max_abs_error == 0.0


# -- MoE and Phi models: one model per architecture, several modules captured from it ----------

def _mixtral():
    cfg = transformers.MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, router_jitter_noise=0.1, attention_dropout=0.2)
    return transformers.MixtralForCausalLM(cfg)


def _qwen2_moe():
    cfg = transformers.Qwen2MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                                      shared_expert_intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, attention_dropout=0.2)
    return transformers.Qwen2MoeForCausalLM(cfg)


def _phi():
    cfg = transformers.PhiConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, attention_dropout=0.2, resid_pdrop=0.2)
    return transformers.PhiForCausalLM(cfg)


# architecture -> (model builder, {case: target}); the MoE blocks run in training mode (Mixtral's router
# jitter scales the block's input in place), Phi's config holds a set (ignore_keys_at_rope_validation)
MOE_CASES = {
    "mixtral": (_mixtral, {"mixtral-moe": "model.layers.0.mlp", "mixtral-attn": "model.layers.0.self_attn",
                           "mixtral-mlp": "model.layers.1.mlp.experts"}),
    "qwen2moe": (_qwen2_moe, {"qwen2moe-moe": "model.layers.0.mlp", "qwen2moe-attn": "model.layers.1.self_attn",
                              "qwen2moe-mlp": "model.layers.0.mlp.shared_expert"}),
    "phi": (_phi, {"phi-attn": "model.layers.0.self_attn", "phi-mlp": "model.layers.1.mlp"}),
}


@pytest.fixture(scope="module")
def moe_captures(tmp_path_factory):
    """Each architecture's model built once (constructors recorded), then one training step per case."""
    from modulelens.capture import init_args

    repo = tmp_path_factory.mktemp("hf-moe-repo")
    refs = {}
    for build, targets in MOE_CASES.values():
        torch.manual_seed(0)
        with init_args.recording():
            model = build().train()
        for case, target in targets.items():
            with modulelens.capture(target, name=case, repo=repo) as cap:
                model(input_ids=torch.randint(0, VOCAB, (2, 7)))
            refs[case] = cap.artifact.ref
    return repo, refs


@pytest.mark.parametrize("case", [case for _, targets in MOE_CASES.values() for case in targets])
def test_moe_and_phi_modules_replay_exactly_by_source_and_export(moe_captures, case):
    repo, refs = moe_captures
    shown = modulelens.show_capture(refs[case], repo=str(repo))
    assert shown.strategies == ["source", "export"] and shown.unrecorded == [], shown.notes
    for strategy in ("source", "export"):
        rep = modulelens.replay_module(refs[case], strategy=strategy, repo=str(repo))
        assert rep.match and rep.exact and rep.max_abs_error == 0.0, (strategy, rep.notes, rep.outputs, rep.state)


def test_the_jittered_moe_block_changes_its_input_in_place_as_in_the_run(moe_captures):
    from modulelens.capture import capture_manifest
    from modulelens.repo import Repository

    repo, refs = moe_captures
    man = capture_manifest(Repository(repo).open("captures", refs["mixtral-moe"]))
    assert man.inputs.tensor_leaves()[0].leaf is False and list(man.state_after) == ["args.0"]
    assert man.export.custom_ops == {"transformers::grouped_mm_fallback": ["transformers.integrations.moe"]}
