"""Statistics of a distributed run: every rank gathers its own, rank 0 merges them.

Each rank's :class:`~modulelens.stats.records.StatsRun` is written to the worker's folder
(:func:`write_rank`); rank 0 waits for the others (:func:`read_ranks`) and merges them with
:func:`merge_ranks`: per sampled step and module, the moment vectors of all ranks merge exactly
(statistics over the union of every rank's elements), call and element counts add up, NaN/Inf flags
and events are united (events of other ranks are appended after rank 0's, in rank order).
Parameter statistics are rank 0's: under data parallelism the weights are replicated and the
gradients all-reduced, so every rank has the same ones.
"""

from __future__ import annotations

import copy
import os
import pickle
import time
from pathlib import Path

from modulelens.errors import CaptureFailed
from modulelens.stats import softmax as SM
from modulelens.stats import stats as S
from modulelens.stats.records import ModuleStep, StatsRun, StepRecord


def rank_file(folder: Path, rank: int) -> Path:
    return folder / f"records-rank{rank}.pkl"


def write_rank(folder: Path, rank: int, run: StatsRun) -> None:
    """Store one rank's run (atomically: the reader never sees half a file)."""
    tmp = folder / f".records-rank{rank}.tmp"
    tmp.write_bytes(pickle.dumps(run))
    os.replace(tmp, rank_file(folder, rank))


def read_ranks(folder: Path, ranks: range, timeout: float) -> list[StatsRun]:
    """The runs of ``ranks``, waiting up to ``timeout`` seconds for ranks that have not finished.
    The files are our own worker's (written by :func:`write_rank` in a private temporary folder)."""
    deadline = time.monotonic() + timeout
    runs = []
    for rank in ranks:
        path = rank_file(folder, rank)
        while not path.is_file():
            if time.monotonic() > deadline:
                raise CaptureFailed(f"rank {rank} did not finish its statistics within {timeout:.0f} s of rank 0",
                                    "check the other ranks' output; rank 0's statistics alone are not stored")
            time.sleep(0.1)
        runs.append(pickle.loads(path.read_bytes()))  # noqa: S301 - written by our own worker (see above)
    return runs


def _merge_module(a: ModuleStep, b: ModuleStep) -> ModuleStep:
    def merged(x: list[float] | None, y: list[float] | None) -> list[float] | None:
        return y if x is None else (x if y is None else S.merge(x, y))

    return ModuleStep(
        type=a.type, act=merged(a.act, b.act), in_sq=a.in_sq + b.in_sq, in_numel=a.in_numel + b.in_numel,
        in_nonfinite=a.in_nonfinite or b.in_nonfinite, calls=a.calls + b.calls, grad=merged(a.grad, b.grad),
        saturation=a.saturation or b.saturation, class_path=a.class_path or b.class_path,
        softmax=SM.merge(a.softmax, b.softmax) if b.softmax is not None else a.softmax,
        softmax_sources=a.softmax_sources + [x for x in b.softmax_sources if x not in a.softmax_sources],
    )


def merge_ranks(runs: list[StatsRun]) -> StatsRun:
    """One run from the runs of every rank (rank 0 first); see the module docstring."""
    out = copy.deepcopy(runs[0])
    by_step = {r.step: r for r in out.records}
    for other in runs[1:]:
        for rec in other.records:
            mine = by_step.get(rec.step)
            if mine is None:
                mine = by_step[rec.step] = StepRecord(step=rec.step, params=dict(rec.params))
                out.records.append(mine)
            for name, ms in rec.modules.items():
                mine.modules[name] = _merge_module(mine.modules[name], ms) if name in mine.modules else ms
            mine.nonfinite += [e for e in rec.nonfinite if e not in mine.nonfinite]
            mine.nonfinite_grads += [n for n in rec.nonfinite_grads if n not in mine.nonfinite_grads]
        out.order += [n for n in other.order if n not in out.order]
        out.types = {**other.types, **out.types}
        out.class_paths = {**other.class_paths, **out.class_paths}
        out.notes += [n for n in other.notes if n not in out.notes]
    out.records.sort(key=lambda r: r.step)
    out.notes.append(f"statistics of {len(runs)} ranks merged exactly (activations and gradients over every rank's "
                     "elements); parameter statistics are rank 0's")
    return out
