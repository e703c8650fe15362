"""The checker's side of one candidate process, shared by card and module validation: requests
(a death becomes :class:`CandidateFailed`), inputs written into the shared arena and outputs read
back, outputs sharing the inputs' memory found from the arena, parameters loaded into a module
candidate, the isolation in force, and the libraries the candidate's process mapped. Every call,
checked or timed, is a :class:`CallRequest` built by :meth:`CandidateChecker.encode_call`; timed
ones go through :func:`time_calls`, the checker's clock (see :mod:`.timed`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from modulelens.errors import ModuleLensError
from modulelens.kernels import (
    LIB_SUFFIX,
    default_build_dir,
    module_build_address,
    publish_build,
    published_mismatch,
    read_loaded_build,
)
from modulelens.sandbox import (
    CandidateDied,
    CandidateProcess,
    Isolation,
    Layer,
    TensorSlot,
    aligned,
    encode_value,
    foreign_in,
    scratch_parent,
    secrets_layer,
    span_bytes,
)
from modulelens.timing import ThreadChoice
from modulelens.validation.candidate_messages import (
    CANDIDATE_REPLIES,
    BuffersRead,
    BuffersRequest,
    Called,
    CallRequest,
    FetchRequest,
    Loaded,
    Ready,
    ReadyRequest,
    StateLoaded,
    StateRequest,
)
from modulelens.validation.compare import same_bits
from modulelens.validation.evidence import built_library_symbols, mapped_libraries
from modulelens.validation.inputs import tensors
from modulelens.validation.verdict_keeping import ReportKeeper

HARNESS = "modulelens.validation.harness"  # what runs in a candidate process
CHECKER_LAYERS: list[Layer] = []  # this checker's own layers (set by tasks.confine), reported with every candidate's
SECRETS: dict[str, Path] = {}  # what -> path no candidate may read (set by tasks.confine); default: the repository


def candidates_folder() -> Path:
    """Where candidate scratch folders go: next to the build cache (not under /tmp, which a
    candidate's mount namespace replaces)."""
    return default_build_dir().parent / "candidates"


def start_candidate(memory_limit_mb: int, read_only: list[Path], harness: str = HARNESS) -> CandidateProcess:
    """A new contained candidate process running ``harness`` (default :data:`HARNESS`): forked from
    the template this checker's worker is (or a standalone one), else started fresh; see
    :class:`CandidateProcess` for what it offers (requests, arena, pause/resume, maps, logs, close).
    ``read_only``: folders it may read (the shared build cache, ...); the :data:`SECRETS` are masked
    in its mount namespace. The eager reference side of
    a timing and a rerun in a fresh process are started the same way, so all sides start alike."""
    return CandidateProcess(harness, CANDIDATE_REPLIES, memory_limit_mb=memory_limit_mb, read_only=read_only,
                            parent=scratch_parent(candidates_folder()), masked=list(SECRETS.values()))


def time_calls(proc: CandidateProcess, request: CallRequest, timeout: float) -> tuple[float, Called]:
    """Seconds of one request (``request.calls`` calls) measured here, between sending it and
    reading its answer (the candidate cannot reach this clock), and the answer. The one timed path
    of every side, reference or candidate. Raises :class:`CandidateDied`."""
    t0 = time.perf_counter()
    reply = proc.request(request, timeout)
    elapsed = time.perf_counter() - t0
    if not isinstance(reply, Called):
        raise CandidateDied(f"answered a call with {reply.kind}")
    return elapsed, reply


class _Call:
    """One call of the candidate as the checker saw it: outputs read back from the arena (and where
    they lay: from ``output_offset``), the input slots as written, and the ops the candidate
    process claims it ran."""

    def __init__(self, outputs: list[torch.Tensor], inputs: list[tuple[TensorSlot, torch.Tensor]],
                 output_slots: list[TensorSlot], output_offset: int, ops: list[str] | None,
                 input_grads: list[torch.Tensor | None] | None = None,
                 param_grads: dict[str, torch.Tensor] | None = None):
        self.outputs, self.inputs, self.output_slots, self.ops = outputs, inputs, output_slots, ops
        self.output_offset = output_offset
        self.input_grads, self.param_grads = input_grads or [], param_grads or {}


class ModuleCall:
    """The module-specific part of a call to a module candidate: mode, RNG state set before it,
    and output gradients to run backward with (``grad_room``: arena bytes to keep for the gradients)."""

    def __init__(self, training: bool, rng: dict[str, torch.Tensor] | None = None,
                 grad_outputs: list[torch.Tensor] | None = None, grad_room: int = 0):
        self.training, self.rng, self.grad_outputs, self.grad_room = training, rng, grad_outputs, grad_room
        self.rng_keys = sorted(rng) if rng else []

    def tensors(self) -> list[torch.Tensor]:
        """The extra tensors written into the arena after the inputs: RNG states, output gradients."""
        return [self.rng[k] for k in self.rng_keys] + list(self.grad_outputs or [])

    def request_fields(self, args: list, kwargs: list, extra: list, names: list[str]) -> dict[str, Any]:
        """CallRequest fields from the encoded values (``extra``: encoded :meth:`tensors`)."""
        n = len(self.rng_keys)
        return {"args": args, "kwargs": dict(zip(names, kwargs)), "training": self.training,
                "rng": dict(zip(self.rng_keys, extra[:n])) if self.rng is not None else None,
                "grad_outputs": extra[n:] if self.grad_outputs is not None else None}


class CandidateFailed(Exception):
    """The candidate raised, ran out of memory, or died: ``reason`` is the rejection."""


class CandidateChecker(ReportKeeper):
    """The checker's side of one candidate process, shared by card and module validation: it
    sends requests (a death becomes :class:`CandidateFailed`), writes inputs into the arena and
    reads outputs back, times the candidate by its own clock, reports the isolation in force, and
    reads from ``/proc`` which foreign numerical libraries the candidate's process mapped.
    ``proc`` is the :class:`CandidateProcess`; subclasses hold the reference and the verdict."""

    proc: CandidateProcess
    call_timeout: float
    threads: ThreadChoice | None = None  # intra-op threads of every call (both sides), chosen at the start

    def _request(self, req, timeout: float | None = None):
        try:
            return self.proc.request(req, timeout or self.call_timeout)
        except CandidateDied as e:
            self.report.stderr_tail = _clean_tail(e.stderr_tail)
            oom = "memory" in e.stderr_tail.lower() or "bad_alloc" in e.stderr_tail
            raise CandidateFailed(f"the candidate process {e.reason} during {self.report.stage}"
                                   + (" (out of memory)" if oom else "")) from None

    def get_ready(self, backend: str) -> None:
        """Let the harness import its own runtime, then note what the process has mapped: the
        baseline that foreign libraries are judged against (:meth:`foreign_libraries`)."""
        reply = self._request(ReadyRequest(backend=backend))
        if not isinstance(reply, Ready):
            raise CandidateFailed(f"the candidate process answered a ready request with {reply.kind}")
        self.baseline_maps = self.proc.mapped_files()

    def publish_extensions(self, loaded: Loaded, source: str, shared: Path) -> None:
        """Publish the ``load_inline`` extensions a module candidate built (names it claims), each
        found at the address this checker computes from ``source`` and the name, read while the
        candidate is stopped without following links and only when it is the inode its process
        mapped (see :meth:`share_fresh_build`); what cannot be verified is simply not shared. Each
        extension gets a line in the checks."""
        for name in loaded.shared_extensions:
            self.check(f"extension {name}", True, "taken from the shared build cache")
            self._note_extension(shared, source, name)
        self.proc.pause()
        try:
            maps = self.proc.maps()
            for name in dict.fromkeys(loaded.fresh_extensions):
                if not name.isidentifier():
                    continue
                address = module_build_address(source, name)
                stale = self.note_stale_build(shared, address, f"{name}{LIB_SUFFIX}", f"extension {name}")
                try:
                    shared_as = self.share_fresh_build(shared, address, f"{name}{LIB_SUFFIX}", maps)
                except ValueError as e:
                    self.check(f"extension {name}", True, f"built, not shared: {e}")
                    continue
                self.check(f"extension {name}", True,
                           (f"built, verified and shared as {address}" + (" (replacing the entry that failed its "
                            "checksum)" if stale else "")) if shared_as
                           else "built, not shared: the build cache could not be written")
                if shared_as:
                    self._note_extension(shared, source, name)
        finally:
            self.proc.resume()

    def share_fresh_build(self, shared: Path, address: str, filename: str, maps: str) -> Path | None:
        """Publish the candidate's fresh build ``build/ADDRESS/FILENAME`` of its scratch folder at
        ``address`` in the shared cache of the build folder ``shared``: exactly the bytes of the
        inode its process mapped (``maps``: its ``/proc/PID/maps``, read with the process stopped,
        as it must stay until this returns), never a build deleted, replaced, truncated or
        rewritten with another layout since it was loaded (see
        :func:`~modulelens.kernels.build_cache.read_loaded_build`). Returns the published file
        (None: the cache could not be written). Raises ValueError saying why it is not the build loaded."""
        data = read_loaded_build(self.proc.scratch, ["build", address, filename], maps)
        return publish_build(shared, address, data, filename)

    def note_stale_build(self, shared: Path, address: str, filename: str, what: str) -> str:
        """When the shared cache's entry at ``address`` fails its checksum (a build both this
        checker and the candidate's process refuse to use), say so in the checks, under ``what``:
        the candidate was built from source instead. Returns the mismatch ('' when none)."""
        stale = published_mismatch(shared, address, filename)
        if stale:
            self.check(f"{what}: shared build cache", True, f"{stale}: not used, built from source again")
        return stale

    def _note_extension(self, shared: Path, source: str, name: str) -> None:
        """Record in the report the published build of extension ``name`` (address and checksum as
        the build cache holds them), so that a pack loads exactly this build."""
        from modulelens.kernels import BUILD_CHECKSUM, publish_dir
        from modulelens.validation.report import ExtensionBuild

        address = module_build_address(source, name)
        try:
            digest = (publish_dir(shared) / address / BUILD_CHECKSUM).read_text().strip()
        except OSError:
            return
        if all(x.name != name for x in self.report.extensions):
            self.report.extensions.append(ExtensionBuild(name=name, address=address, sha256=digest))

    def foreign_libraries(self) -> list[str]:
        """Foreign numerical libraries (:data:`FOREIGN_LIBRARIES`) the candidate's process mapped
        since :meth:`get_ready`, as ``name (file)``: read by this process from ``/proc/PID/maps``,
        which the kernel writes and the candidate cannot forge."""
        base = getattr(self, "baseline_maps", None)
        if base is None:
            return []
        return foreign_in(self.proc.mapped_files() - base)

    def _isolation(self, loaded: Loaded, repo_root: Path) -> Isolation:
        """The candidate's layers (as it reports them), what this checker knows of how it was made
        (fork server, sealed arena), whether the secrets are out of its reach, and the checker's
        own layers (``checker: ...``)."""
        iso = loaded.isolation.model_copy(deep=True)
        if self.proc.namespaces_missing:
            iso.layers = [x for x in iso.layers if x.name != "namespaces"]
            iso.add("namespaces", False, self.proc.namespaces_missing)
        iso.add("process separation", True, "the candidate runs in its own process; reference outputs, "
                "comparison, the clock and verdict stay in the checker; eager is timed in a reference process "
                "of its own")
        iso.layers.append(secrets_layer(iso, self.proc.read_only, dict(SECRETS) or {"the repository": repo_root},
                                        self.proc.masked))
        iso.layers.extend(x.model_copy() for x in self.proc.layers)
        iso.layers.extend(x.model_copy() for x in CHECKER_LAYERS)
        return iso

    def _write_inputs(self, values: list, proc: CandidateProcess | None = None
                      ) -> tuple[list, list[tuple[TensorSlot, torch.Tensor]], int]:
        arena = (proc or self.proc).arena
        written: list[tuple[TensorSlot, torch.Tensor]] = []
        need = sum(aligned(span_bytes(t)) for t in tensors(values) if isinstance(t, torch.Tensor))
        arena.resize(need + 1)
        offset = 0

        def put(t: torch.Tensor) -> TensorSlot:
            nonlocal offset
            slot = arena.put(t, offset)
            written.append((slot, arena.read(slot)))
            offset = aligned(offset + slot.nbytes)
            return slot

        encoded = [encode_value(v, put) for v in values]
        return encoded, written, offset

    def encode_call(self, args: list, kwargs: dict, want: list[torch.Tensor], trace: bool,
                    module_call: ModuleCall | None = None, *, proc: CandidateProcess | None = None,
                    calls: int = 1, seed: int = 0) -> tuple[CallRequest, list[tuple[TensorSlot, torch.Tensor]]]:
        """Write the inputs into ``proc``'s arena (default: the candidate's) and build the request
        for ``calls`` calls on them: the same request for a check and a timed batch. Returns the
        request and the input slots as written. Card calls pass keyword values positionally;
        module calls by name."""
        proc = proc or self.proc
        values = [*args, *kwargs.values()]
        extra = module_call.tensors() if module_call else []
        try:
            encoded, written, end = self._write_inputs(values + extra, proc)
        except ValueError as e:
            raise ModuleLensError(f"inputs cannot be passed to a candidate: {e}", "pick another card") from None
        grad_bytes = sum(aligned(span_bytes(t)) for t in extra)
        out_bytes = sum(aligned(max(w.numel() * w.element_size(), 1)) for w in want)
        proc.arena.resize(end + 2 * out_bytes + (module_call.grad_room if module_call else 0) + grad_bytes
                          + (1 << 16))
        fields: dict[str, Any] = {"args": encoded[:len(values)]}
        if module_call:
            fields = module_call.request_fields(encoded[:len(args)], encoded[len(args):len(values)],
                                                encoded[len(values):], list(kwargs))
        request = CallRequest(arena_size=proc.arena.size, output_offset=end,
                              poison_nbytes=[w.numel() * w.element_size() for w in want], trace=trace,
                              calls=calls, seed=seed, threads=self.threads.threads if self.threads else None,
                              **fields)
        return request, written[:len(tensors(values))]

    def read_reply(self, reply: Any, label: str, proc: CandidateProcess | None = None) -> tuple[
            list[torch.Tensor], list[torch.Tensor | None], dict[str, torch.Tensor]]:
        """(outputs, input gradients, parameter gradients) of a call's reply, read from the arena;
        a candidate error, an out-of-memory or an unreadable output raises CandidateFailed."""
        arena = (proc or self.proc).arena
        if not isinstance(reply, Called):
            raise CandidateFailed(f"the candidate process answered a call with {reply.kind}")
        if reply.out_of_memory:
            raise CandidateFailed(f"exceeded the memory limit on {label}: {reply.error[:300]}")
        if reply.error:
            self.report.errors.append(reply.error)
            raise CandidateFailed(f"raised {reply.error.split(':')[0]} on {label}: {reply.error[:300]}")
        try:
            outputs = [arena.read(s) for s in reply.outputs]
            input_grads = [arena.read(s) if s is not None else None for s in reply.input_grads]
            param_grads = {n: arena.read(s) for n, s in reply.param_grads.items()}
        except ValueError as e:
            raise CandidateFailed(f"returned an output the checker cannot read ({e}) on {label}") from None
        return outputs, input_grads, param_grads

    def call(self, args: list, kwargs: dict, want: list[torch.Tensor], trace: bool, label: str,
             module_call: ModuleCall | None = None) -> _Call:
        """Write the inputs, call the candidate once, read its outputs back (and, for a module call
        with output gradients, its gradients). Raises CandidateFailed."""
        request, inputs = self.encode_call(args, kwargs, want, trace, module_call)
        reply = self._request(request)
        outputs, input_grads, param_grads = self.read_reply(reply, label)
        self.numpy_bridges.update(reply.numpy_bridges)
        return _Call(outputs, inputs, reply.outputs, request.output_offset, reply.ops, input_grads, param_grads)

    def outputs_sharing_inputs(self, result: _Call, allowed: frozenset[int] = frozenset()) -> list[int]:
        """The outputs of ``result`` that share memory with its inputs, however the candidate mapped
        it (a view, a second mapping of the arena): this process inverts every byte of the input
        regions in the arena, has the candidate copy its last outputs out again without calling it,
        and sees which outputs changed. ``allowed``: outputs that may (an in-place operator's first).
        The inputs are left inverted. Raises CandidateFailed."""
        if not result.inputs or not any(t.numel() for t in result.outputs):
            return []
        arena = self.proc.arena
        for slot, _ in result.inputs:
            for start in range(0, slot.nbytes, 1 << 26):
                raw = TensorSlot(offset=slot.offset + start, nbytes=min(1 << 26, slot.nbytes - start),
                                 dtype="torch.uint8", shape=[min(1 << 26, slot.nbytes - start)], stride=[1])
                arena.put(torch.bitwise_not(arena.read(raw)), raw.offset)
        reply = self._request(FetchRequest(output_offset=result.output_offset))
        if not isinstance(reply, Called) or reply.error or len(reply.outputs) != len(result.outputs):
            raise CandidateFailed("could not copy its outputs out again after the call "
                                  f"({getattr(reply, 'error', '') or 'another number of outputs'})")
        try:
            return [i for i, (slot, before) in enumerate(zip(reply.outputs, result.outputs))
                    if i not in allowed and before.numel() and not same_bits(arena.read(slot), before)]
        except ValueError as e:
            raise CandidateFailed(f"copied its outputs out again where the checker cannot read them ({e})") from None

    def load_state(self, state: dict[str, torch.Tensor]) -> str:
        """Load ``state`` (parameters and buffers by name) into the module candidate through the
        arena: '' when it took them, else its error."""
        encoded, _, _ = self._write_inputs(list(state.values()))
        reply = self._request(StateRequest(state=dict(zip(state, encoded))))
        if not isinstance(reply, StateLoaded):
            raise CandidateFailed(f"the candidate process answered a state request with {reply.kind}")
        return reply.error

    def read_buffers(self, like: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
        """The module candidate's buffers of the names of ``like`` (the reference's, which size the
        room kept for them), copied out of its process through the arena without calling it:
        (the buffers read, the names it lacks). Raises CandidateFailed."""
        self.proc.arena.resize(sum(aligned(max(t.numel() * t.element_size(), 1)) for t in like.values()) + (1 << 16))
        reply = self._request(BuffersRequest(names=list(like)))
        if not isinstance(reply, BuffersRead):
            raise CandidateFailed(f"the candidate process answered a buffers request with {reply.kind}")
        if reply.error:
            raise CandidateFailed(f"its buffers could not be read after a training call: {reply.error}")
        try:
            return {n: self.proc.arena.read(s) for n, s in reply.buffers.items() if n in like}, reply.missing
        except ValueError as e:
            raise CandidateFailed(f"copied its buffers where the checker cannot read them ({e})") from None

    def built_symbols(self) -> list[str]:
        """Vendor and past-the-dispatcher ATen symbols imported by the libraries the candidate built
        and loaded (shared objects under its scratch folder or the build cache in its memory map,
        which the kernel writes), as ``symbol (library)``; see :func:`built_library_symbols`."""
        return built_library_symbols(mapped_libraries(self.proc.maps(), [self.proc.scratch, default_build_dir()]),
                                     runtime=[self.proc.scratch / "triton"])

    def foreign_evidence(self) -> list[str]:
        """Wrapper evidence the checker holds beyond aten ops: foreign libraries newly mapped,
        torch<->numpy crossings (claimed)."""
        found = [f"maps {name}" for name in self.foreign_libraries()]
        if self.numpy_bridges:
            found.append("crosses into numpy (" + ", ".join(sorted(self.numpy_bridges)) + ")")
        return found


def _clean_tail(text: str) -> str:
    """A stderr tail safe to show: control characters other than newline and tab removed."""
    return "".join(c for c in text if c in "\n\t" or c.isprintable())[-1500:]
