"""The candidate process: ``python -m modulelens.validation.harness REQ_FD REPLY_FD ARENA_FD SCRATCH MEMORY_MB [READ_ONLY_DIR]``.

Started by :class:`modulelens.sandbox.candidate_process.CandidateProcess` (forked from a template
that preloaded :data:`PRELOAD`, or fresh; inside new namespaces where the kernel allows), it hands
the checker a descriptor of its own ``/proc/self/maps`` and then applies the remaining containment
layers to itself *before* any candidate code exists in it (private /tmp and /dev, rlimits, not
dumpable, Landlock, seccomp), then serves requests: load (compile) the candidate, call it on
inputs the checker wrote into the shared arena and copy its outputs there (and again on request,
after the checker rewrote the inputs), load other parameters into a module candidate or copy its
buffers out (after training calls), or deny the reference library before any candidate code loads
(a denial process, :mod:`modulelens.validation.poison`). A check and a timed batch are the same
request handled by the same function at the same line (:meth:`_Harness.call`): nothing on the stack or in the
arguments but the number of calls tells them apart, and timed calls are checked too (random calls
of every batch, drawn by the checker after the batch answered: every call's result is kept until
the next request). It holds no reference output, no checker and no
verdict: the worst a candidate can do here is lie about itself, and the checker treats what this
process says as claims.

The reference side of a timing (eager, the original module, torch.compile) runs in a process
started and served exactly the same way, which loads the reference as its entry
(:meth:`_Harness.load_op`, or :meth:`_Harness.load_module` with a source naming the original
class), so whatever the process, the pipes and the arena cost falls on both sides.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from modulelens.kernels import CANDIDATE_RUNTIME
from modulelens.sandbox import CONTAINMENT_RUNTIME

# What a template imports before forking candidate processes (modulelens.sandbox.forkserver): the
# runtime every candidate process imports anyway, so a fork finds it imported.
PRELOAD = ("modulelens.validation.candidate_messages", *CONTAINMENT_RUNTIME, *CANDIDATE_RUNTIME, "torch.utils.cpp_extension",
           "safetensors.torch", "triton.language", "triton.runtime.interpreter")
# Work a fork server template does while idle, whose result every fork can use (introspection only).
WARM = ("modulelens.validation.poison:denial_plan", "modulelens.validation.poison:numerical_library_paths",
        "modulelens.validation.sampling:warm_symbols")


def _contain(req_fd: int, scratch: Path, memory_mb: int, read_only: list[str]) -> tuple[Any, list[str]]:
    import torch

    from modulelens.sandbox import (
        MASKED_VARIABLE,
        Isolation,
        apply_landlock,
        apply_rlimits,
        apply_seccomp,
        hand_over_maps,
        mask_paths,
        not_dumpable,
        private_dev,
        private_tmp,
        readable_roots,
    )
    from modulelens.validation.sampling import open_task_sampler

    sampler = open_task_sampler()  # before seccomp (which refuses perf_event_open) and any candidate code
    hand_over_maps(req_fd, sampler)  # first: the checker reads it from outside, before any candidate code
    for fd in sampler:  # the checker holds them now: candidate code finds no descriptor of its sampler
        os.close(fd)
    iso = Isolation()
    described = os.environ.pop("MODULELENS_NAMESPACES", "")
    missing = os.environ.pop("MODULELENS_NAMESPACES_MISSING", "")
    in_namespaces = os.getpid() == 1 and bool(described)
    iso.add("namespaces", in_namespaces, described if in_namespaces else (missing or "not started in new namespaces"))
    readable = readable_roots([str(scratch), *read_only])
    tmp = private_tmp(readable)
    iso.layers.append(tmp)
    masked = json.loads(os.environ.pop(MASKED_VARIABLE, "[]"))  # the repository, the signing key
    if masked:
        iso.layers.append(mask_paths(masked, [str(scratch), *read_only], private_tmp=tmp.in_force))
    dev = private_dev()
    iso.layers.append(dev)
    iso.layers.append(apply_rlimits(memory_mb, limit_address_space=not torch.cuda.is_available()))
    iso.layers.append(not_dumpable())
    iso.layers.append(apply_landlock([str(scratch)], readable, private_dev=dev.in_force))
    iso.layers.append(apply_seccomp())  # last: the layers above need mount and prctl
    return iso, readable


def _tensors(value: Any) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


class _Harness:
    def __init__(self, arena_fd: int, isolation: Any, scratch: Path, readable: list[str]):
        from modulelens.sandbox import MappedArena

        self.arena = MappedArena(arena_fd)
        self.scratch = scratch
        self.isolation = isolation
        self.readable = readable
        self.entry: Any = None
        self.last_outputs: list = []  # the last call's output tensors, copied out again on request
        self.call_outputs: list = []  # what every call of the last request returned (FetchRequest.call)
        self.device_inputs: list = []  # (slot, device copy) of the last call: refreshed before a fetch

    def ready(self, req) -> Any:
        """Import what the harness itself needs for this backend (its runtime, numpy through torch)
        and start counting torch<->numpy crossings, before any candidate code exists here."""
        from modulelens.validation.candidate_messages import Ready

        if req.backend == "module":
            import safetensors.torch  # noqa: F401

            from modulelens.kernels import ModuleCandidate  # noqa: F401 - the module candidates' runtime
        else:
            from modulelens.kernels import get_backend

            get_backend(req.backend)
            if req.backend == "triton":
                try:  # the interpreter (numpy inside) is the harness's, not the candidate's
                    import triton.language  # noqa: F401
                    import triton.runtime.interpreter  # noqa: F401
                except ImportError:
                    pass
        _NumpyBridges.install()
        return Ready(pid=os.getpid())

    def load(self, req) -> Any:
        from modulelens.kernels import CompileError, builds_in_process, get_backend, use_shared_builds
        from modulelens.validation.candidate_messages import Loaded

        if req.shared_build_dir:
            use_shared_builds(Path(req.shared_build_dir))
        backend = get_backend(req.candidate.backend)
        try:
            if req.compile_only:
                log = backend.compile_only(req.candidate.source, Path(req.build_dir))
                return Loaded(isolation=self.isolation, ok=True, log_tail=log[-300:])
            self.entry = backend.load(req.candidate.source, req.candidate.entry, Path(req.build_dir))
        except CompileError as e:
            return Loaded(isolation=self.isolation, ok=False, error=e.message)
        builds = builds_in_process()
        if not builds:
            return Loaded(isolation=self.isolation, ok=True)
        name, library, fresh = builds[-1]
        return Loaded(isolation=self.isolation, ok=True, build_name=name, library=library, fresh_build=fresh)

    def load_op(self, req) -> Any:
        """The reference operator as the entry (plain, or through torch.compile)."""
        from modulelens.ops import resolve_op
        from modulelens.validation.candidate_messages import Loaded

        try:
            op = resolve_op(req.op)
        except (AttributeError, ValueError) as e:
            return Loaded(isolation=self.isolation, ok=False, error=f"unknown operator {req.op}: {e}")
        n, names = req.positional, list(req.kw_names)

        def reference(*values: Any) -> Any:
            return op(*values[:n], **dict(zip(names, values[n:])))

        if req.compiled:
            import torch

            reference = torch.compile(reference, dynamic=False)
        self.entry = reference
        return Loaded(isolation=self.isolation, ok=True)

    def load_module(self, req) -> Any:
        """Run a module candidate's source (its ``load_inline`` extensions through the shared
        build cache), build its class with the captured constructor arguments and load the
        captured weights by name (strict)."""
        from safetensors.torch import load_file

        from modulelens.kernels import builds_in_process, construct, load_class, route_load_inline, use_shared_builds
        from modulelens.validation.candidate_messages import Loaded

        if req.shared_build_dir:
            use_shared_builds(Path(req.shared_build_dir))
        route_load_inline(req.source, self.scratch / "build")
        try:
            cls = load_class(req.source, req.class_name)
        except BaseException as e:  # noqa: BLE001 - a source that fails to load is the candidate's answer
            return Loaded(isolation=self.isolation, ok=False, error=_load_error(e), failed_step="load")
        try:
            tensors = load_file(req.init_tensors) if req.init_tensors else {}
            module = construct(cls, req.init_args, req.init_kwargs, tensors, req.sys_path).to(req.device)
            module.load_state_dict(load_file(req.state, device=req.device), strict=True)
        except BaseException as e:  # noqa: BLE001
            text = str(e).strip().splitlines()
            return Loaded(isolation=self.isolation, ok=False, failed_step="build",
                          error=text[0][:300] if text else type(e).__name__)
        self.entry = module
        builds = builds_in_process()
        return Loaded(isolation=self.isolation, ok=True, fresh_extensions=[n for n, _, built in builds if built],
                      shared_extensions=[n for n, _, built in builds if not built])

    def call(self, req) -> Any:
        """One request, check or timed batch alike: ``req.calls`` calls in a row (the floating
        inputs swapped between them, see :mod:`modulelens.validation.perturb`), the last call's
        outputs copied into the arena. Every call's result is kept (a reference in a list sized
        before the loop: no copy, nothing timed but the store) until the next request, so that the
        checker can have any call's outputs copied out after the batch (:meth:`fetch`): each call
        answers for its own outputs, and one returning memory a later call overwrites shows."""
        import contextlib

        import torch

        from modulelens.sandbox import decode_value
        from modulelens.validation.candidate_messages import Called

        if req.threads and torch.get_num_threads() != req.threads:
            torch.set_num_threads(req.threads)
        self.call_outputs = []  # the previous request's results go before this one's are made
        self.last_outputs = []
        inputs: list = []
        input_slots: list = []
        self.device_inputs = []

        def get(slot):
            t = self.arena.view(slot)
            if slot.device != "cpu":
                dev = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=slot.device)
                dev.copy_(t)
                self.device_inputs.append((slot, dev))
                t = dev
            inputs.append(t)
            input_slots.append(slot)
            return t

        args = [decode_value(a, get) for a in req.args]
        kwargs = {k: decode_value(v, get) for k, v in req.kwargs.items()}
        swaps = self._swaps(inputs, input_slots, req.seed) if req.calls > 1 else None
        rng = {k: decode_value(v, get) for k, v in req.rng.items()} if req.rng is not None else None
        grad_outputs = [decode_value(g, lambda s: self.arena.read(s)) for g in req.grad_outputs or []]
        invoke = self._invocation(args, kwargs, req.training, rng, bool(req.grad_outputs))
        for n in req.poison_nbytes:  # freed blocks of the output sizes hold NaN, not an earlier result
            device = inputs[0].device if inputs else "cpu"
            poison = torch.full((max(n // 4, 1),), float("nan"), dtype=torch.float32, device=device)
            del poison
        ops = None
        results: list = [None] * req.calls
        try:
            with _NumpyBridges() as bridges, (_OpTrace() if req.trace else contextlib.nullcontext()) as trace:
                for i in range(req.calls):
                    if i:
                        swaps(i)
                    results[i] = out = invoke()
            ops = trace.names if req.trace else None
            if inputs and inputs[0].is_cuda:
                torch.cuda.synchronize()
            grads = self._backward(out, grad_outputs) if req.grad_outputs else None
        except MemoryError as e:
            return Called(error=f"MemoryError: {e}", out_of_memory=True)
        except BaseException as e:  # noqa: BLE001 - whatever the candidate raises is its answer
            text = str(e).strip().splitlines()[0] if str(e).strip() else ""
            oom = isinstance(e, RuntimeError) and ("allocate" in text or "memory" in text.lower())
            return Called(error=f"{type(e).__name__}: {text[:500]}", out_of_memory=oom)
        self.call_outputs = results
        self.last_outputs = _tensors(out)
        try:
            slots, offset = self._put_outputs(req.output_offset)
        except ValueError as e:
            return Called(error=f"output too large: {e}")
        reply = Called(outputs=slots, ops=ops, numpy_bridges=bridges.names)
        if grads is not None:
            try:
                self._put_grads(reply, grads, offset)
            except ValueError as e:
                return Called(error=f"gradients too large: {e}")
        return reply

    def _put_outputs(self, offset: int, outputs: list | None = None) -> tuple[list, int]:
        """Copy ``outputs`` (default: the last call's) into the arena from ``offset``: (slots,
        offset after them)."""
        from modulelens.sandbox import aligned

        slots = []
        for o in self.last_outputs if outputs is None else outputs:
            slots.append(self.arena.put(o, offset))
            offset = aligned(offset + slots[-1].nbytes)
        return slots, offset

    def fetch(self, req) -> Any:
        """The last call's outputs copied into the arena again, without calling: the checker rewrote
        the inputs in between, so an output sharing their memory (however it was mapped) changed.
        With ``req.call``: the outputs that call of the last request returned, as they are now."""
        from modulelens.validation.candidate_messages import Called

        if req.call is not None:
            if req.call >= len(self.call_outputs):
                return Called(error=f"the last request made {len(self.call_outputs)} call(s), not {req.call + 1}")
            try:
                slots, _ = self._put_outputs(req.output_offset, _tensors(self.call_outputs[req.call]))
            except ValueError as e:
                return Called(error=f"output too large: {e}")
            return Called(outputs=slots)
        for slot, dev in self.device_inputs:  # inputs on a device are copies: rewrite them too
            dev.copy_(self.arena.view(slot))
        try:
            slots, _ = self._put_outputs(req.output_offset)
        except ValueError as e:
            return Called(error=f"output too large: {e}")
        return Called(outputs=slots)

    def state(self, req) -> Any:
        """Load the parameters and buffers the checker wrote into the arena into the module
        candidate (strict, by name)."""
        import torch

        from modulelens.sandbox import decode_value
        from modulelens.validation.candidate_messages import StateLoaded

        try:
            values = {k: decode_value(v, self.arena.read) for k, v in req.state.items()}
            with torch.no_grad():
                self.entry.load_state_dict(values, strict=True)
        except BaseException as e:  # noqa: BLE001 - a module that cannot take the state is the candidate's answer
            text = str(e).strip().splitlines()
            return StateLoaded(error=f"{type(e).__name__}: {text[0][:300] if text else ''}")
        return StateLoaded()

    def buffers(self, req) -> Any:
        """The module candidate's buffers named in ``req`` (from its state dict) copied into the
        arena, without calling it: what its training calls left in its running statistics."""
        import torch

        from modulelens.sandbox import aligned
        from modulelens.validation.candidate_messages import BuffersRead

        try:
            state = self.entry.state_dict()
        except BaseException as e:  # noqa: BLE001 - a module without a readable state dict is its answer
            text = str(e).strip().splitlines()
            return BuffersRead(error=f"{type(e).__name__}: {text[0][:300] if text else ''}")
        reply, offset = BuffersRead(), req.output_offset
        for name in req.names:
            value = state.get(name)
            if not isinstance(value, torch.Tensor):
                reply.missing.append(name)
                continue
            try:
                reply.buffers[name] = self.arena.put(value.detach(), offset)
            except ValueError as e:
                return BuffersRead(error=f"buffer {name} too large: {e}")
            offset = aligned(offset + reply.buffers[name].nbytes)
        return reply

    def deny(self, req) -> Any:
        """Make the reference library unusable here (:mod:`modulelens.validation.poison`), before any
        candidate code exists in this process."""
        from modulelens.validation import poison
        from modulelens.validation.candidate_messages import Denied

        if self.entry is not None:
            return Denied(operators=0, numpy="", error="a candidate is already loaded")
        operators = poison.poison_operators(frozenset(req.keep))
        if req.numpy == "memory":
            numpy, layers = poison.unusable_numpy(self.readable)
        else:
            numpy, layers = poison.python_numpy_denial(), []
        self.isolation.layers.extend(layers)
        return Denied(operators=operators, numpy=numpy, layers=[x.name for x in layers if x.in_force])

    def _swaps(self, inputs: list, slots: list, seed: int) -> Any:
        """The swaps between the calls of a batch over the floating inputs: on the arena's bytes
        (memoryviews of each input's whole span as integers of its element size: no numpy, which
        a denial process has made unusable) for CPU inputs, on the device copy otherwise."""
        from modulelens.validation.perturb import Swaps, item_format, perturbed

        spans = []
        for t, slot in zip(inputs, slots):
            if not perturbed(t):
                continue
            if t.device.type == "cpu":
                spans.append(self.arena.elements(slot, item_format(t.element_size())))
            else:
                spans.append(_DeviceSpan(t))
        return Swaps(spans, seed)

    def _invocation(self, args: list, kwargs: dict, training: bool | None, rng: dict | None, grad: bool) -> Any:
        """The call itself: a card candidate on its arguments; a module in train (with grad) or eval
        (without) mode, its RNG state set first; with ``grad``, on leaf copies of the inputs that
        require grad (kept in ``self.grad_leaves``)."""
        import torch

        entry = self.entry
        if training is None:
            return lambda: entry(*args, **kwargs)
        from modulelens.capture import set_rng_states

        entry.train(training)
        if grad:
            args = [a.detach().clone().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a
                    for a in args]
            self.grad_leaves = args

        def invoke() -> Any:
            if rng is not None:
                set_rng_states(rng)
            with torch.set_grad_enabled(training):
                return entry(*args, **kwargs)

        return invoke

    def _backward(self, out: Any, grad_outputs: list) -> tuple[list, dict]:
        import torch

        self.entry.zero_grad(set_to_none=True)
        outs = [o for o in _tensors(out) if o.requires_grad]
        torch.autograd.backward(outs, [g.to(o.device, o.dtype) for g, o in zip(grad_outputs, outs)])
        leaves = [a.grad if isinstance(a, torch.Tensor) else None for a in self.grad_leaves]
        params = {n: p.grad for n, p in self.entry.named_parameters() if p.grad is not None}
        return leaves, params

    def _put_grads(self, reply: Any, grads: tuple[list, dict], offset: int) -> None:
        from modulelens.sandbox import aligned

        def put(t):
            nonlocal offset
            slot = self.arena.put(t, offset)
            offset = aligned(offset + slot.nbytes)
            return slot

        leaves, params = grads
        reply.input_grads = [put(g) if g is not None else None for g in leaves]
        reply.param_grads = {n: put(g) for n, g in params.items()}


def _load_error(e: BaseException) -> str:
    """Short text of a load failure: the first compiler errors of a failed C++ build, else the
    exception's first line."""
    from modulelens.kernels import summarize_errors

    text = str(e)
    if "error:" in text:
        return f"{type(e).__name__}: " + summarize_errors(text, {"main.cpp": (0, 1 << 30)})
    lines = text.strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:500] if lines else ''}"


class _DeviceSpan:
    """A device tensor's whole storage as a sequence of elements (for the swaps of a batch)."""

    def __init__(self, t: Any):
        import torch

        n = t.untyped_storage().nbytes() // t.element_size()
        self.flat = torch.as_strided(t, (n,), (1,), 0)

    def __len__(self) -> int:
        return self.flat.numel()

    def __getitem__(self, i: int) -> Any:
        return self.flat[i].clone()

    def __setitem__(self, i: int, value: Any) -> None:
        self.flat[i] = value


class _NumpyBridges:
    """Counts, while active, the crossings between torch and numpy (``Tensor.numpy``,
    ``Tensor.__array__``, ``torch.from_numpy``, ``torch.as_tensor``/``torch.tensor`` of an
    ndarray): a candidate computing in numpy has to cross twice. Installed by the harness before
    candidate code; a claim like the op trace (candidate code could undo the wrappers)."""

    _active: list[str] | None = None

    def __enter__(self) -> _NumpyBridges:
        self.names: list[str] = []
        _NumpyBridges._active = self.names
        return self

    def __exit__(self, *exc: Any) -> None:
        _NumpyBridges._active = None
        self.names = sorted(set(self.names))

    @staticmethod
    def _from_runtime(frame: Any) -> bool:
        """The crossing is made by torch itself or Triton's interpreter (which runs kernels on numpy
        arrays), not by the candidate's own code."""
        module = frame.f_globals.get("__name__", "") if frame is not None else ""
        return module.split(".")[0] in ("torch", "triton")

    @staticmethod
    def install() -> None:
        import torch

        def note(name: str, original: Any, only_ndarray: bool = False) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                active = _NumpyBridges._active
                if (active is not None and (not only_ndarray or (args and type(args[0]).__module__ == "numpy"))
                        and not _NumpyBridges._from_runtime(sys._getframe(1))):
                    active.append(name)
                return original(*args, **kwargs)
            return wrapper

        torch.Tensor.numpy = note("Tensor.numpy", torch.Tensor.numpy)
        torch.Tensor.__array__ = note("Tensor.__array__", torch.Tensor.__array__)
        torch.from_numpy = note("torch.from_numpy", torch.from_numpy)
        torch.as_tensor = note("torch.as_tensor(ndarray)", torch.as_tensor, only_ndarray=True)
        torch.tensor = note("torch.tensor(ndarray)", torch.tensor, only_ndarray=True)


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


def _steady_allocator() -> None:
    """Fix glibc's mmap threshold (64 MiB) so that allocations below it come from the heap in
    every process alike. By default the threshold adapts to what the process freed before, so
    two processes with different histories (a candidate after its checks, a fresh reference)
    would pay differently for the same allocation (an mmap and page faults per call, or not),
    and a timing would measure their pasts."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 128 << 20)  # M_TRIM_THRESHOLD: freed memory is kept, not returned per call
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> int:
    req_fd, reply_fd, arena_fd = int(argv[0]), int(argv[1]), int(argv[2])
    scratch, memory_mb, read_only = Path(argv[3]), int(argv[4]), argv[5:]
    _steady_allocator()
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    isolation, readable = _contain(req_fd, scratch, memory_mb, read_only)
    from modulelens.sandbox import receive_message_with_fds, send_message
    from modulelens.validation.candidate_messages import CANDIDATE_REQUESTS

    harness = _Harness(arena_fd, isolation, scratch, readable)
    # one handler per request kind: a check and a timed batch are both "call" (the same function)
    handlers = {"ready": harness.ready, "load": harness.load, "load_op": harness.load_op,
                "load_module": harness.load_module, "call": harness.call, "fetch": harness.fetch,
                "state": harness.state, "buffers": harness.buffers, "deny": harness.deny}
    while True:
        req, fds = receive_message_with_fds(req_fd, CANDIDATE_REQUESTS)
        if req is None:
            return 0
        if fds:  # the checker made a bigger arena: it comes with the request that needs it
            harness.arena.replace(fds[0])
        try:
            reply = handlers[req.kind](req)
        except BaseException:  # noqa: BLE001 - a broken harness ends the process; the checker sees it die
            traceback.print_exc()
            return 70
        send_message(reply_fd, reply)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
