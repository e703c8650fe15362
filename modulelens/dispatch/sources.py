"""The one adapter between the repository's records and packs.

``candidate_record(repo, candidate_id)`` gathers everything a pack entry needs about a stored
candidate: its source and backend, what it replaces (an operator card's aten overload, or a
captured module's class and path), the exact call pattern it was validated on (decoded from the
card's first stored sample, or the capture's inputs), the latest validation report and its
speedup. Nothing else in :mod:`modulelens.dispatch` reads candidate, card or capture records.
"""

from __future__ import annotations

import base64
from typing import Literal

import torch
from pydantic import BaseModel

from modulelens.dispatch.pack import ModuleInit
from modulelens.dispatch.patterns import CallPattern, describe_call
from modulelens.errors import ModuleLensError
from modulelens.repo import Repository
from modulelens.validation import ValidationReport


class CandidateRecord(BaseModel):
    candidate_id: str
    kind: Literal["op", "module"]
    target: str
    capture: str
    op: str | None = None
    class_path: str | None = None
    module_path: str | None = None
    pattern: CallPattern
    phase: Literal["forward", "backward"] = "forward"
    backend: str
    entry: str
    source: str
    source_sha256: str
    init: ModuleInit | None = None
    claims_training: bool = False
    report: ValidationReport | None = None


def candidate_record(repo: Repository, candidate_id: str) -> CandidateRecord:
    """The record of a stored card-level or module-level candidate (see the module docstring)."""
    from modulelens.kernels import CANDIDATES, is_module_candidate

    art = repo.open(CANDIDATES, candidate_id)
    return _module_record(repo, candidate_id) if is_module_candidate(art) else _card_record(repo, candidate_id)


def _card_record(repo: Repository, candidate_id: str) -> CandidateRecord:
    from modulelens.capture import KIND as CAPTURES
    from modulelens.capture import capture_manifest
    from modulelens.kernels import candidate_manifest, load_candidate
    from modulelens.ops import OpSetManifest, open_card, sample_call
    from modulelens.validation import latest_report

    art, src = load_candidate(repo, candidate_id)
    card_id = candidate_manifest(art).target.card_id
    opset_art, card = open_card(repo, card_id)
    opset = opset_art.manifest_as(OpSetManifest)
    cap_art = repo.open(CAPTURES, opset.capture)
    capture = capture_manifest(cap_art)
    args, kwargs, _, synthesized = sample_call(opset_art, card, 0, device=card.device)
    if synthesized:
        raise ModuleLensError(f"card {card_id}'s sample is shape-only", "the pattern needs a stored sample")
    grad = capture.grad_enabled or opset.backward
    pattern = describe_call(args, kwargs, grad_enabled=grad and card.phase == "forward", training=capture.training)
    return CandidateRecord(candidate_id=art.ref, kind="op", target=card.card_id, capture=cap_art.ref, op=card.op,
                           pattern=pattern, phase=card.phase, backend=src.backend, entry=src.entry, source=src.source,
                           source_sha256=src.sha256, report=latest_report(repo, art))


def _module_record(repo: Repository, candidate_id: str) -> CandidateRecord:
    from safetensors.torch import save

    from modulelens.capture import KIND as CAPTURES
    from modulelens.capture import LoadedCapture, capture_manifest
    from modulelens.kernels import MODULE_BACKEND, load_module_candidate
    from modulelens.validation import latest_report

    art, cand, target = load_module_candidate(repo, candidate_id)
    cap_art = repo.open(CAPTURES, target.capture)
    cap = capture_manifest(cap_art)
    loaded = LoadedCapture(cap_art)
    args, kwargs = loaded.inputs()
    if cap.init is None:
        raise ModuleLensError(f"capture {cap_art.ref} has no recorded constructor arguments",
                              "module candidates are built with the captured constructor arguments; capture again "
                              "with the module built while recording")
    tensors = {}
    if cap_art.has_file("init.safetensors"):
        from modulelens.capture import load_tensors

        tensors = load_tensors(cap_art, "init.safetensors")
    init = ModuleInit(args=cap.init.args, kwargs=cap.init.kwargs,
                      tensors_b64=base64.b64encode(save(tensors)).decode() if tensors else "", sys_path=cap.sys_path)
    # A candidate that does not claim training support was validated in eval mode without grad only.
    training = cand.claims_training and cap.training
    pattern = describe_call(args, kwargs, grad_enabled=cap.grad_enabled if training else False, training=training)
    return CandidateRecord(candidate_id=art.ref, kind="module", target=cap_art.ref, capture=cap_art.ref, class_path=target.class_path,
                           module_path=target.module_path, pattern=pattern, backend=MODULE_BACKEND,
                           entry=cand.class_name, source=cand.source, source_sha256=cand.sha256, init=init,
                           claims_training=cand.claims_training, report=latest_report(repo, art))


class CaptureReplay:
    """What check-pack needs of a capture: rebuild the module, its inputs, the captured outputs
    and RNG state, and the mode it ran in."""

    def __init__(self, repo: Repository, ref: str):
        from modulelens.capture import KIND as CAPTURES
        from modulelens.capture import LoadedCapture, capture_manifest

        art = repo.open(CAPTURES, ref)
        manifest = capture_manifest(art)
        self.ref = art.ref
        self.training = manifest.training
        self.grad_enabled = manifest.grad_enabled
        self.device = manifest.environment.device
        self.module_path = manifest.module_path
        self.loaded = LoadedCapture(art)
        self.has_grads = manifest.backward is not None

    def grad_outputs(self) -> list[torch.Tensor | None]:
        """The captured gradients of the outputs, in output order (empty without gradients)."""
        if not self.has_grads:
            return []
        grads = self.loaded.grads()
        n = 1 + max((int(k.split(".")[1]) for k in grads if k.startswith("grad_output.")), default=-1)
        return [grads.get(f"grad_output.{i}") for i in range(n)]
