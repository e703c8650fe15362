"""torch.compile and autograd state, as the hooks of a statistics run need them: whether dynamo is
off, running compiled code eagerly on sampled steps, and whether autograd's backward is running."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch


def dynamo_disabled() -> bool:
    if os.environ.get("TORCHDYNAMO_DISABLE") == "1":
        return True
    dynamo = sys.modules.get("torch._dynamo")
    return bool(dynamo is not None and getattr(dynamo.config, "disable", False))


def force_eager() -> Callable[[], None] | None:
    """Make ``torch.compile``d code run eagerly (dynamo's ``force_eager`` stance) until the returned
    function restores the previous stance; None when dynamo is not in use (not imported, disabled)
    or the stance cannot be set here. Module hooks do not run inside compiled code, and hooks added
    to compiled code cause graph breaks and recompiles: sampled steps run eagerly instead, so their
    statistics are exact and the compiled graphs of the other steps stay as they are."""
    if "torch._dynamo" not in sys.modules or dynamo_disabled():
        return None
    try:
        from torch._dynamo import eval_frame

        prior = eval_frame._set_stance(eval_frame.DynamoStance("force_eager"))
    except Exception:  # noqa: BLE001 - private API, or called inside a compiled region
        return None
    return lambda: eval_frame._set_stance(prior)


def in_backward() -> bool:
    """True while autograd's backward runs (calls made then are recomputation, not training activity)."""
    try:
        return torch._C._current_graph_task_id() != -1
    except Exception:  # noqa: BLE001 - private API; assume not
        return False
