"""The candidate process: ``python -m modulelens.sandbox.candidate REQ_FD REPLY_FD ARENA_FD SCRATCH MEMORY_MB [READ_ONLY_DIR]``.

Started by :class:`modulelens.sandbox.candidate_process.CandidateProcess` (inside new namespaces
where the kernel allows), it applies the remaining containment layers to itself *before* any
candidate code exists in it (private /tmp, rlimits, Landlock), then serves requests: load
(compile) the candidate, call it on inputs the checker wrote into the shared arena and copy its
outputs there, or call it again N times for the checker's clock. It holds no reference output,
no checker and no verdict: the worst a candidate can do here is lie about itself, and the checker
treats what this process says as claims.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any


def _contain(scratch: Path, memory_mb: int, read_only: list[str]) -> Any:
    import torch

    from modulelens.sandbox.containment import Isolation, apply_landlock, apply_rlimits, private_tmp, readable_roots

    iso = Isolation()
    described = os.environ.pop("MODULELENS_NAMESPACES", "")
    iso.add("namespaces", os.getpid() == 1 and bool(described),
            described if os.getpid() == 1 else "not started in new namespaces")
    readable = readable_roots([str(scratch), *read_only])
    iso.layers.append(private_tmp(readable))
    iso.layers.append(apply_rlimits(memory_mb, limit_address_space=not torch.cuda.is_available()))
    iso.layers.append(apply_landlock([str(scratch)], readable))
    iso.add("seccomp", False, "no system-call filter is installed")
    return iso


def _tensors(value: Any) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _overlaps(a, b) -> bool:
    try:
        sa, sb = a.untyped_storage(), b.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return False
    if a.device != b.device or sa.nbytes() == 0 or sb.nbytes() == 0:
        return False
    pa, pb = sa.data_ptr(), sb.data_ptr()
    return pa < pb + sb.nbytes() and pb < pa + sa.nbytes()


class _Harness:
    def __init__(self, arena_fd: int, isolation: Any):
        from modulelens.sandbox.shm import SharedArena

        self.arena = SharedArena(size=1 << 16, fd=arena_fd)
        self.isolation = isolation
        self.entry: Any = None
        self.args: list = []

    def load(self, req) -> Any:
        from modulelens.kernels import build_cache
        from modulelens.kernels.backends import CompileError, get_backend
        from modulelens.sandbox.candidate_messages import Loaded

        if req.shared_build_dir:
            build_cache.use_shared_builds(Path(req.shared_build_dir))
        backend = get_backend(req.candidate.backend)
        try:
            if req.compile_only:
                log = backend.compile_only(req.candidate.source, Path(req.build_dir))
                return Loaded(isolation=self.isolation, ok=True, log_tail=log[-300:])
            self.entry = backend.load(req.candidate.source, req.candidate.entry, Path(req.build_dir))
        except CompileError as e:
            return Loaded(isolation=self.isolation, ok=False, error=e.message)
        builds = build_cache.builds_in_process()
        if not builds:
            return Loaded(isolation=self.isolation, ok=True)
        name, library, fresh = builds[-1]
        return Loaded(isolation=self.isolation, ok=True, build_name=name, library=library, fresh_build=fresh)

    def call(self, req) -> Any:
        import torch

        from modulelens.sandbox.candidate_messages import Called
        from modulelens.sandbox.shm import aligned, decode_value

        self.arena.remap(req.arena_size)
        inputs: list = []

        def get(slot):
            t = self.arena.view(slot)
            if slot.device != "cpu":
                dev = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=slot.device)
                dev.copy_(t)
                t = dev
            inputs.append(t)
            return t

        self.args = [decode_value(a, get) for a in req.args]
        for n in req.poison_nbytes:  # freed blocks of the output sizes hold NaN, not an earlier result
            device = inputs[0].device if inputs else "cpu"
            poison = torch.full((max(n // 4, 1),), float("nan"), dtype=torch.float32, device=device)
            del poison
        ops = None
        try:
            if req.trace:
                with _OpTrace() as trace:
                    out = self.entry(*self.args)
                ops = trace.names
            else:
                out = self.entry(*self.args)
            if inputs and inputs[0].is_cuda:
                torch.cuda.synchronize()
        except MemoryError as e:
            return Called(error=f"MemoryError: {e}", out_of_memory=True)
        except BaseException as e:  # noqa: BLE001 - whatever the candidate raises is its answer
            text = str(e).strip().splitlines()[0] if str(e).strip() else ""
            oom = isinstance(e, RuntimeError) and ("allocate" in text or "memory" in text.lower())
            return Called(error=f"{type(e).__name__}: {text[:500]}", out_of_memory=oom)
        outs = _tensors(out)
        slots, aliases = [], []
        offset = req.output_offset
        for o in outs:
            aliases.append(next((i for i, a in enumerate(inputs) if _overlaps(o, a)), None))
            try:
                slots.append(self.arena.put(o, offset))
            except ValueError as e:
                return Called(error=f"output too large: {e}")
            offset = aligned(offset + slots[-1].nbytes)
        return Called(outputs=slots, aliases=aliases, ops=ops)

    def repeat(self, req) -> Any:
        import torch

        from modulelens.sandbox.candidate_messages import Repeated

        try:
            for _ in range(req.calls):
                self.entry(*self.args)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        except BaseException as e:  # noqa: BLE001
            return Repeated(error=f"{type(e).__name__}: {str(e)[:300]}")
        return Repeated()


class _OpTrace:
    """The profiler's record of every aten op run in this process (all threads) during the block."""

    def __enter__(self) -> _OpTrace:
        from torch._C._profiler import _ExperimentalConfig
        from torch.autograd import ProfilerActivity, ProfilerConfig, ProfilerState, _enable_profiler, _prepare_profiler

        self.names: list[str] = []
        config = ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False,
                                _ExperimentalConfig(profile_all_threads=True))
        _prepare_profiler(config, {ProfilerActivity.CPU})
        _enable_profiler(config, {ProfilerActivity.CPU})
        return self

    def __exit__(self, *exc: Any) -> None:
        from torch.autograd import _disable_profiler

        result = _disable_profiler()
        self.names = sorted({e.name() for e in result.events()})


def main(argv: list[str]) -> int:
    req_fd, reply_fd, arena_fd = int(argv[0]), int(argv[1]), int(argv[2])
    scratch, memory_mb, read_only = Path(argv[3]), int(argv[4]), argv[5:]
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    isolation = _contain(scratch, memory_mb, read_only)
    from modulelens.sandbox import protocol
    from modulelens.sandbox.candidate_messages import CANDIDATE_REQUESTS, CallRequest, LoadRequest

    harness = _Harness(arena_fd, isolation)
    while True:
        req = protocol.receive(req_fd, CANDIDATE_REQUESTS)
        if req is None:
            return 0
        try:
            if isinstance(req, LoadRequest):
                reply = harness.load(req)
            elif isinstance(req, CallRequest):
                reply = harness.call(req)
            else:
                reply = harness.repeat(req)
        except BaseException:  # noqa: BLE001 - a broken harness ends the process; the checker sees it die
            traceback.print_exc()
            return 70
        protocol.send(reply_fd, reply)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
