"""optimize's module level with an LLM provider: the provider writes a ``ModelNew`` from the capture
(class source, forward signature, shapes and dtypes, weights by name), module validation judges it
like any module candidate, and a child of a failed one is a repair that gets the failed one's source
and report. The Anthropic provider runs against a fake wire (no network); the sampling provider
against a fake client sampler. Three module validations in the sandbox (about half a minute)."""

from __future__ import annotations

import json
import types

import pytest
import torch
from conftest import TanhScale as Scale  # tanh(x) * weight: a module nobody here fused

import modulelens
from modulelens.registry import ToolContext
from modulelens.repo import Repository
from modulelens.search.model import SearchSettings

pytestmark = pytest.mark.slow


def _reply(body: str, rule: str = "") -> str:
    return ("Here it is.\n```python\nimport torch\nimport torch.nn as nn\n" + rule + "\n\nclass ModelNew(nn.Module):\n"
            "    def __init__(self, dim):\n        super().__init__()\n        self.weight = nn.Parameter(torch.ones(dim))\n\n"
            f"    def forward(self, x):\n        return {body}\n```\n")


CORRECT = _reply("torch.tanh(x) * self.weight", "# modulelens-variable-dims: 0.0")
WRONG = _reply("torch.tanh(x)")


@pytest.fixture(scope="module")
def scale_repo(tmp_path_factory):
    """A repository with the capture ``scale`` (eval mode) and its cards, and the same call as ``again``
    (its module level starts empty)."""
    from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops

    repo = tmp_path_factory.mktemp("module-llm-repo")
    with modulelens.capture("", name="scale", repo=repo, export=False):
        Scale(16).eval()(torch.randn(8, 16))
    with modulelens.capture("", name="again", repo=repo, export=False):
        Scale(16).eval()(torch.randn(8, 16))
    capture_ops(CaptureOpsRequest(ref="scale", repeats=3), ToolContext(repo_root=repo))
    return repo


@pytest.fixture
def anthropic_env(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-real-key")
    for name in ("ANTHROPIC_BASE_URL", "MODULELENS_ANTHROPIC_MODEL", "MODULELENS_PRICE_IN", "MODULELENS_PRICE_OUT"):
        monkeypatch.delenv(name, raising=False)


class RoutingTransport:
    """The Anthropic wire: ModelNew prompts get the queued module replies, card prompts a reply
    without code (that card child fails at generation, cheaply)."""

    def __init__(self, *module_replies: str):
        self.module_replies = list(module_replies)
        self.module_prompts: list[str] = []

    def post(self, url, headers, body, timeout):
        from test_providers import ok

        payload = json.loads(body)
        if "ModelNew" in payload["system"]:
            self.module_prompts.append(payload["messages"][0]["content"])
            return ok(text=self.module_replies.pop(0), tokens=(1000, 500))
        return ok(text="I cannot write this one.", tokens=(100, 10))


def test_optimize_with_anthropic_validates_a_modelnew_it_wrote(scale_repo, anthropic_env, monkeypatch):
    from modulelens.providers import anthropic
    from modulelens.tools.optimize import OptimizeRequest, optimize

    transport = RoutingTransport(CORRECT)
    monkeypatch.setattr(anthropic, "UrllibTransport", lambda: transport)
    result = optimize(OptimizeRequest(targets=["scale"], provider="anthropic", max_evals=1, top=1),
                      ToolContext(repo_root=scale_repo))
    (module,) = result.modules
    (node,) = module.nodes
    assert node.provider == "anthropic" and node.parent is None and module.evaluations == 1
    assert node.correct and node.verdict == "wrapper", node.reason  # torch operators: correct, not custom
    (prompt,) = transport.module_prompts
    assert "return torch.tanh(x) * self.weight" in prompt and "forward(x)" in prompt  # class source, signature
    assert "shape [8, 16], float32" in prompt and "weight: shape [16], float32" in prompt and "int = 16" in prompt
    assert module.cost_usd == pytest.approx((1000 * 3 + 500 * 15) / 1e6)
    assert result.cost_usd >= module.cost_usd  # the search's spend includes the module level's
    from modulelens.kernels import load_module_candidate
    from modulelens.validation.stored_reports import latest_report

    art, cand, _ = load_module_candidate(Repository(scale_repo), node.candidate)
    assert cand.provenance["search"] == result.search_id and cand.provenance["model"].startswith("claude")
    rule = latest_report(Repository(scale_repo), art).shape_rule
    assert rule is not None and rule.checked and rule.text() == "0.0"  # the declared batch, checked at other sizes
    if module.best_candidate:  # when the machine's load let its speedup be determined
        assert module.best_candidate == node.candidate
        # suggested for the pack only when surely faster than eager; otherwise a warning says why not
        surely = module.speedup_interval[0] > 1
        assert (node.candidate in result.pack_candidates) == surely, (module, result.warnings)
        assert surely or any("not surely faster" in w for w in result.warnings), result.warnings


def test_a_rejected_modelnew_gets_a_repair_child_that_sees_its_report(scale_repo, anthropic_env):
    from test_providers import FakeTransport, ok

    from modulelens.providers.anthropic import AnthropicProvider
    from modulelens.search.modules import search_module

    transport = FakeTransport(ok(text=WRONG), ok(text=CORRECT))
    provider = AnthropicProvider(transport, sleep=lambda s: None)
    outcome = search_module(Repository(scale_repo), "again", SearchSettings(provider="anthropic", max_evals=2),
                            provider=provider, search_id="repair")
    wrong, fixed = outcome.nodes
    assert wrong.verdict == "rejected" and not wrong.correct and fixed.parent == wrong.candidate and fixed.correct
    repair = transport.calls[1]["body"]["messages"][0]["content"]
    assert "Improve an earlier `ModelNew`" in repair and "return torch.tanh(x)\n" in repair  # the parent's source
    assert wrong.reason in repair and "failed validation" in repair  # its report, and the task: a repair
    assert outcome.evaluations == 2 and outcome.stopped_because is None


def test_sampling_writes_a_modelnew_and_a_failing_provider_stops_the_level(scale_repo, monkeypatch):
    from modulelens.providers.module_request import describe_capture
    from modulelens.providers.sampling import SamplingProvider
    from modulelens.search.modules import search_module

    prompts = []

    def sample(system, user, max_tokens):
        prompts.append((system, user))
        return CORRECT, "client-model"

    req = describe_capture(Repository(scale_repo).open("captures", "scale"))
    cand = SamplingProvider().generate_module(req, types.SimpleNamespace(sample=sample))
    assert cand.provider == "sampling" and cand.provenance["model"] == "client-model" and "class ModelNew" in cand.source
    assert "modulelens-variable-dims" in prompts[0][0] and not cand.claims_training  # captured in eval mode

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    outcome = search_module(Repository(scale_repo), "scale", SearchSettings(provider="anthropic"))
    assert outcome.evaluations == 0 and "ANTHROPIC_API_KEY is not set" in outcome.stopped_because
