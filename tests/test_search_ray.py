"""The ray executor: a search on a local Ray instance (2 CPUs) gives the same verdicts as the
local executor on the same card (the template search of test_search)."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray", reason="ray is an optional dependency: pip install 'modulelens[ray]'")

from test_search import _summary, gelu_card, template_search  # noqa: E402,F401  (shared fixtures)


@pytest.mark.slow
def test_a_search_on_ray_gives_the_local_verdicts(gelu_card, template_search):  # noqa: F811
    from modulelens.repo import Repository
    from modulelens.search.executors import RayExecutor
    from modulelens.search.loop import run_search, start_or_resume
    from modulelens.search.model import SearchSettings
    from modulelens.search.targets import resolve_targets

    repo, card = gelu_card
    r = Repository(repo)
    settings = SearchSettings(max_evals=2)
    search, _ = start_or_resume(r, resolve_targets(r, [card], settings, 1), settings, executor="ray",
                                search_id="on-ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        executor = RayExecutor()
        out = run_search(r, search, executor)
    finally:
        ray.shutdown()
    local = {n.variant: n.verdict for n in _summary(repo, "tpl").targets[0].nodes if n.status == "evaluated"}
    remote_nodes = [n for n in _summary(repo, "on-ray").targets[0].nodes if n.status == "evaluated"]
    assert {n.variant: n.verdict for n in remote_nodes} == local
    assert all(n.worker.startswith("ray:") and n.candidate_id for n in remote_nodes)
    assert all(n.report and n.report.startswith("act.card") for n in remote_nodes)  # reports back in the repository
    assert out.targets[0].best_candidate and out.targets[0].remeasured
