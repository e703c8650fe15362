"""A fork server template does its idle work (the harness's imports, then its ``WARM`` functions)
and freezes its objects, so that forks find the denial plan and the numerical libraries already
worked out, and their garbage collector never copies the template's pages. Checked in a child
process: freezing is for good."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import gc, json, sys
from modulelens.sandbox import forkserver
from modulelens.validation import poison
pending = forkserver.idle_steps(["modulelens.validation.harness"])
steps = len(pending)
before = poison._PLAN is None and not poison._LIBRARY_PATHS
while pending:
    forkserver.run_idle_step(pending)
import torch
plan = poison.denial_plan()
print(json.dumps({"steps": steps, "before": before, "planned": len(plan), "frozen": gc.get_freeze_count(),
                  "cuda_keys": sorted({k for _, k in plan if "CUDA" in k}), "threads": forkserver.thread_count(),
                  "cached": tuple(sys.path) in poison._LIBRARY_PATHS,
                  "softmax": ["aten::_softmax", "CPU"] in [list(x) for x in plan]}))
"""


def test_the_template_warms_the_denial_plan_and_freezes_its_objects():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["steps"] == 2 and out["before"]  # the harness's imports, then its WARM functions
    assert out["planned"] > 1000 and out["softmax"] and out["cached"], out
    assert out["frozen"] > 10_000, out  # the template's objects are out of every fork's collections
    assert out["threads"] == 1, out  # idle work starts no thread: the template can still fork
    if not out["cuda_keys"]:
        import torch

        assert not torch.cuda.is_available()  # CUDA kernels are planned only where torch has them
