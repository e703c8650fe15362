"""Isolated worker processes that compile and run candidate kernels.

A candidate that segfaults, hangs, prints, or allocates without bound ends or harms only its
worker; the caller gets a verdict and a fresh worker next time.

Generic isolation only: containment (namespaces, private /tmp, rlimits, Landlock, seccomp), the
shared-memory arena, protocol framing, and the lifecycle of worker processes (:mod:`.pool`,
:mod:`.worker`) and contained candidate processes (:mod:`.candidate_process`). It imports neither
``kernels`` nor ``validation``: a caller says what runs (a worker's task runner and the frames it
answers with, :class:`~modulelens.sandbox.worker_messages.WorkerKind`; a candidate process's
harness module and replies), always a module inside modulelens fixed by the caller's code.

Other packages import only the names below, from ``modulelens.sandbox``; each is imported from its
module on first use (:func:`modulelens.faces.lazy_face`), so a candidate process that needs the
containment alone imports nothing else."""

from modulelens.faces import lazy_face

# The modules a candidate process imports to contain itself (a fork server template preloads them).
CONTAINMENT_RUNTIME = ("modulelens.sandbox.containment", "modulelens.sandbox.mounts", "modulelens.sandbox.seccomp")

_FACE = {
    # Worker processes: the pool, its head start, and the frames a task runner answers with.
    "DEFAULT_MEMORY_LIMIT_MB": "pool", "SandboxPool": "pool", "prestart": "pool", "shared_pool": "pool",
    "CrashedResult": "worker_messages", "InternalErrorResult": "worker_messages", "Message": "worker_messages",
    "StageReport": "worker_messages", "TaskRunner": "worker_messages", "WorkerKind": "worker_messages",
    "WorkerResult": "worker_messages",
    # Contained candidate processes.
    "CandidateDied": "candidate_process", "CandidateProcess": "candidate_process",
    "scratch_parent": "candidate_process", "MASKED_VARIABLE": "candidate_process",
    # The containment layers a candidate process applies to itself, and what is in force.
    "CHECKER": "containment", "FOREIGN_LIBRARIES": "containment", "Isolation": "containment", "Layer": "containment",
    "apply_landlock": "containment", "apply_rlimits": "containment", "confine_checker": "containment",
    "foreign_in": "containment", "hand_over_maps": "containment", "not_dumpable": "containment",
    "private_tmp": "containment", "readable_roots": "containment", "restrict_reading": "containment",
    "secrets_layer": "containment", "private_dev": "mounts", "mask_paths": "mounts", "MASKED": "containment",
    "apply_seccomp": "seccomp", "install_filter": "seccomp", "machine_arch": "seccomp", "no_exec_program": "seccomp",
    # The shared-memory arena tensors travel through.
    "MappedArena": "shm", "TensorSlot": "shm", "aligned": "shm", "decode_value": "shm", "encode_value": "shm",
    "span_bytes": "shm",
    # Framing of the messages between a checker and its candidate process.
    "receive_message_with_fds": "protocol:receive_with_fds", "send_message": "protocol:send",
}
__all__ = ["CONTAINMENT_RUNTIME", *_FACE]
__getattr__, __dir__ = lazy_face(__name__, _FACE)

