"""Build an opset from a capture: replay the module under an operator recorder, time every variant
against plain runs of the module, and store the variants as ranked operator cards."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from modulelens.capture import KIND as CAPTURES
from modulelens.capture import (
    CaptureManifest,
    Encoder,
    LoadedCapture,
    TensorSink,
    capture_manifest,
    flatten,
    set_rng_states,
)
from modulelens.device import is_cuda, require
from modulelens.errors import ModuleLensError
from modulelens.ops.model import KIND, SAMPLES_FILE, CardSample, ModuleTime, OpCard, OpSetManifest
from modulelens.ops.recorder import OpRecorder, OpTimer, Variant
from modulelens.repo import Artifact, Repository

TIMER = ("time.perf_counter around each operator call (CUDA synchronised) inside a TorchDispatchMode; "
         "module time from plain runs interleaved with the timed ones")


class RecordOptions(BaseModel):
    """How to record a capture's operators (the capture-ops tool's request extends this)."""

    strategy: Literal["auto", "source", "export", "pickle"] = Field("auto")
    trust_pickle: bool = Field(False)
    backward: bool = Field(False, description="Also backward operators.")
    samples: int = Field(2, ge=1, le=16, description="Sample calls kept per card.")
    repeats: int = Field(15, ge=3, description="Timed runs (medians).")
    max_tensor_bytes: int = Field(64 * 1024 * 1024, ge=0, le=1 << 40,
                                  description="Larger samples are stored shape-only.")
    include_views: bool = Field(False)
    allow_synthesized: bool = Field(False, description="Allow shape-only capture inputs.")


def _check_inputs(art: Artifact, m: CaptureManifest, allow_synthesized: bool) -> None:
    inputs = m.inputs.tensor_leaves()
    if not inputs:
        raise ModuleLensError(
            f"capture {art.ref} has no tensor inputs",
            "operator cards need real inputs as the oracle; capture a module that takes tensors",
        )
    if not any(s.stored for s in inputs) and not allow_synthesized:
        raise ModuleLensError(
            f"capture {art.ref} stores its inputs shape-only, so the cards would hold synthetic samples",
            "capture again with a larger [--max-tensor-bytes], or pass [--allow-synthesized]",
        )


class _ModuleRunner:
    """Runs the rebuilt module on fresh copies of the captured inputs, as the capture ran it
    (RNG state, grad mode), optionally with a backward pass from the captured output gradients."""

    def __init__(self, loaded: LoadedCapture, m: CaptureManifest, backward: bool):
        self.loaded, self.backward = loaded, backward
        self.rng = loaded.rng()
        self.grad_mode = m.grad_enabled or backward
        self.has_grads = m.backward is not None
        self.cuda = is_cuda(m.environment.device)

    def fresh(self) -> tuple[list, dict]:
        """The captured inputs rebuilt for one run (objects inside them too, such as a key/value
        cache the previous run grew), each tensor given as it was in the run (see
        :meth:`LoadedCapture.inputs`)."""
        return self.loaded.inputs()

    def run(self, module: Any, inputs: tuple[list, dict], before_backward: Callable[[], None] | None = None) -> Any:
        """One call on ``inputs`` (from :meth:`fresh`, made outside any timer or recorder)."""
        a, k = inputs
        if self.rng:
            set_rng_states(self.rng)
        with torch.set_grad_enabled(self.grad_mode):
            out = module(*a, **k)
            if self.backward:
                outs = [o for o in flatten(out) if isinstance(o, torch.Tensor) and o.requires_grad]
                if before_backward:
                    before_backward()
                if outs:
                    torch.autograd.backward(outs, self._grad_outputs(outs))
        return out

    def timed_run(self, module: Any) -> float:
        """Wall seconds of one call (the input copies are made before the clock starts)."""
        inputs = self.fresh()
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.run(module, inputs)
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def _grad_outputs(self, outs: list[torch.Tensor]) -> list[torch.Tensor]:
        grads = self.loaded.grads() if self.has_grads else {}
        gen = torch.Generator().manual_seed(0)
        result = []
        for i, o in enumerate(outs):
            g = grads.get(f"grad_output.{i}")
            if g is None or tuple(g.shape) != tuple(o.shape):
                g = torch.randn(o.shape, generator=gen, dtype=torch.float32)
            result.append(g.to(o.device, o.dtype))
        return result


def record_opset(repo: Repository, capture_ref: str, options: RecordOptions,
                 progress: Callable[[int, int, str], None] | None = None) -> Artifact:
    """Record the operators the capture ``capture_ref`` runs and store them as a new version of
    the opset named like the capture. Returns the stored opset. ``progress(done, total, message)``
    hears of each step: the recording call, each timing repeat, the storing of the cards."""
    say = progress or (lambda done, total, message: None)
    total = options.repeats + 2
    say(0, total, f"recording the operators {capture_ref} runs (one call)")
    art = repo.open(CAPTURES, capture_ref)
    m = capture_manifest(art)
    _check_inputs(art, m, options.allow_synthesized)
    device = require(m.environment.device, can_choose=False)
    loaded = LoadedCapture(art, device=device)
    runner = _ModuleRunner(loaded, m, options.backward)

    def record(module):
        recorder = OpRecorder(samples=options.samples)
        inputs = runner.fresh()
        with recorder:
            runner.run(module, inputs, before_backward=lambda: setattr(recorder, "phase", "backward"))
        return module, recorder

    (module, recorder), strategy, _, _ = loaded.with_strategy(options.strategy, options.trust_pickle, record)
    notes = []
    if options.backward and not any(v.phase == "backward" for v in recorder.variants.values()):
        notes.append("backward was asked for, but no output required grad: only forward operators were recorded")

    # Time shares: interleave plain runs (module time) with runs under the per-op timer.
    for _ in range(2):
        runner.run(module, runner.fresh())
    plain: list[float] = []
    per_variant: dict[str, list[float]] = {key: [] for key in recorder.variants}
    for i in range(options.repeats):
        say(1 + i, total, f"timing each operator of {art.ref}: repeat {i + 1}/{options.repeats} "
                          f"({len(recorder.variants)} operator calls)")
        plain.append(runner.timed_run(module))
        timer, inputs = OpTimer(), runner.fresh()
        with timer:
            runner.run(module, inputs)
        for key in per_variant:
            per_variant[key].append(timer.seconds.get(key, 0.0))
    module_time = statistics.median(plain)
    q = statistics.quantiles(plain, n=5) if len(plain) >= 5 else [min(plain)] * 4
    seconds = {key: statistics.median(times) for key, times in per_variant.items()}
    variants = sorted(recorder.variants.values(), key=lambda v: -seconds[v.key])
    listed = [v for v in variants if options.include_views or v.kind != "view"]
    views_share = sum(seconds[v.key] for v in variants if v.kind == "view") / module_time

    say(total - 1, total, f"storing {len(listed)} cards with their samples")
    sink = TensorSink("", options.max_tensor_bytes)
    # A card's index is its call site (the variant's first-call order), its rank its place by time share.
    cards = [_card(v, v.first_seen, rank, seconds[v.key], module_time, sink) for rank, v in enumerate(listed)]

    def write(folder: Path) -> OpSetManifest:
        if sink.tensors:
            from safetensors.torch import save_file

            save_file(sink.tensors, str(folder / SAMPLES_FILE))
        return OpSetManifest(
            capture=art.ref, strategy=strategy, device=device, backward=options.backward,
            module_time=ModuleTime(median_s=module_time, p20_s=q[0], p80_s=q[-1], repeats=options.repeats),
            views_time_share=views_share, cards=cards, notes=notes, timer=TIMER,
        )

    return repo.create(KIND, art.name, write)


def _card(v: Variant, index: int, rank: int, seconds: float, module_time: float, sink: TensorSink) -> OpCard:
    samples = []
    for j, s in enumerate(v.samples):
        prefix = f"c{index}.s{j}."
        enc = Encoder(sink)
        sink.prefix = prefix
        sample = CardSample(args=enc.encode(list(s.args), "args"), kwargs=enc.encode(dict(s.kwargs), "kwargs"),
                            output=enc.encode(s.output, "output"))
        if s.rng is not None:
            sink.tensors[prefix + "rng"] = s.rng.clone()
            sample.rng = prefix + "rng"
        samples.append(sample)
    sink.prefix = ""
    return OpCard(
        index=index, rank=rank, op=v.op, kind=v.kind, phase=v.phase,
        shapes=[t["shape"] for t in v.tensors], dtypes=[t["dtype"] for t in v.tensors],
        strides=[t["stride"] for t in v.tensors], contiguous=[t["contiguous"] for t in v.tensors],
        device=v.tensors[0]["device"] if v.tensors else "cpu", args=v.others, calls=v.calls,
        time_s=seconds, time_share=seconds / module_time if module_time else 0.0,
        bytes_per_call=v.bytes_per_call, uninitialised_output=v.uninitialised, samples=samples,
    )
