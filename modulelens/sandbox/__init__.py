"""Isolated worker processes that compile and run candidate kernels.

A candidate that segfaults, hangs, prints, or allocates without bound ends or harms only its
worker; the caller gets a verdict and a fresh worker next time.

Generic isolation only: containment (namespaces, private /tmp, rlimits, Landlock, seccomp), the
shared-memory arena, protocol framing, and the lifecycle of worker processes (:mod:`.pool`,
:mod:`.worker`) and contained candidate processes (:mod:`.candidate_process`). It imports neither
``kernels`` nor ``validation``: a caller says what runs (a worker's task runner and the frames it
answers with, :class:`~modulelens.sandbox.worker_messages.WorkerKind`; a candidate process's
harness module and replies), always a module inside modulelens fixed by the caller's code."""
