"""Where candidates are evaluated: an :class:`Executor` takes an :class:`EvalTask` and returns a
future of its :class:`EvalResult`.

Every evaluation is one call of :func:`modulelens.validation.sandboxed.validate_candidate`: the
candidate runs in a sandbox worker that times eager and the candidate interleaved, so each
result's speedup is against a baseline measured by the same worker, and results from different
workers (or machines) are compared only through those ratios. The final re-measurement
(:meth:`Executor.remeasure`) times a target's finalists together in one worker.

* :class:`LocalExecutor`: N threads, each with its own sandbox pool (its own worker process);
  reports are stored by the validation itself. Each evaluation runs in its submitter's context, so
  cancelling the call that runs the search stops the sandbox workers (an interrupted report is
  stored for each candidate stopped).
* :class:`RayExecutor`: each evaluation is a Ray task (one CPU, or one GPU for CUDA cards) that
  receives the card's opset files and the candidate source, rebuilds them in a scratch repository
  on its node, runs the same validation there and sends the report back; the caller stores it
  (:func:`store_result`). ``address`` joins a cluster (``ray://...`` or ``host:port``); without one a
  local Ray instance is started.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import os
import socket
import threading
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, Field

from modulelens.device import is_cuda
from modulelens.errors import ModuleLensError
from modulelens.kernels import KernelSource, load_candidate
from modulelens.repo import Repository
from modulelens.sandbox import SandboxPool
from modulelens.validation import (
    RemeasuredResult,
    ValidationReport,
    ValidationSettings,
    new_pool,
    remeasure_candidates,
    save_report,
    validate_candidate,
)


class EvalTask(BaseModel):
    repo: str = Field(description="Root of the repository holding the candidate and its card.")
    candidate_id: str
    source: KernelSource
    settings: ValidationSettings
    timeout_s: float = 900.0
    device: str = "cpu"


class EvalResult(BaseModel):
    report: ValidationReport
    report_ref: str | None = Field(None, description="The stored report; None until the caller stores it (Ray).")
    worker: str
    seconds: float = 0.0


class RemeasureRequest(BaseModel):
    """Finalists of one card to time together against eager (the search's final re-measurement)."""

    repo: str
    card_id: str
    sources: list[KernelSource]
    min_run_time: float
    timing_budget_s: float
    device: str = "cpu"


class Executor(Protocol):
    name: str
    workers: int

    def submit(self, task: EvalTask) -> concurrent.futures.Future[EvalResult]: ...

    def remeasure(self, request: RemeasureRequest) -> RemeasuredResult: ...

    def close(self) -> None: ...


def remeasure_in_repo(request: RemeasureRequest, sandbox: SandboxPool | None) -> RemeasuredResult:
    """Time the finalists of ``request`` together in ``sandbox`` (a worker of this machine)."""
    return remeasure_candidates(Repository(request.repo), request.card_id, request.sources,
                                min_run_time=request.min_run_time, timing_budget_s=request.timing_budget_s,
                                device=request.device, sandbox=sandbox)


def evaluate_in_repo(task: EvalTask, sandbox: SandboxPool | None, worker: str) -> EvalResult:
    """Validate the stored candidate of ``task`` in ``sandbox`` (the report is stored)."""
    import time

    repo = Repository(task.repo)
    art, _ = load_candidate(repo, task.candidate_id)
    start = time.monotonic()
    v = validate_candidate(repo, art, task.source, task.settings, timeout=task.timeout_s, sandbox=sandbox)
    report = ValidationReport.model_validate(v.model_dump(include=set(ValidationReport.model_fields)))
    return EvalResult(report=report, report_ref=v.report, worker=worker, seconds=time.monotonic() - start)


def store_result(repo: Repository, task: EvalTask, result: EvalResult) -> EvalResult:
    """Store the report of a result that came back from elsewhere (a Ray node) in ``repo``."""
    if result.report_ref is not None:
        return result
    art, _ = load_candidate(repo, task.candidate_id)
    stored = save_report(repo, art, result.report, task.settings)
    return result.model_copy(update={"report_ref": stored.ref})


class LocalExecutor:
    """``workers`` sandbox workers on this machine, one thread each."""

    name = "local"

    def __init__(self, workers: int = 1):
        self.workers = max(1, workers)
        self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="ml-search")
        self._local = threading.local()
        self._sandboxes: list[SandboxPool] = []
        self._lock = threading.Lock()

    def _sandbox(self) -> tuple[SandboxPool, str]:
        if not hasattr(self._local, "sandbox"):
            with self._lock:
                self._local.sandbox = new_pool()
                self._local.name = f"local-{len(self._sandboxes)}"
                self._sandboxes.append(self._local.sandbox)
        return self._local.sandbox, self._local.name

    def _run(self, task: EvalTask) -> EvalResult:
        sandbox, name = self._sandbox()
        return evaluate_in_repo(task, sandbox, name)

    def submit(self, task: EvalTask) -> concurrent.futures.Future[EvalResult]:
        """Evaluate ``task`` on one of the threads, in the caller's context: a call cancelled
        (:mod:`modulelens.cancellation`) stops the sandbox worker evaluating it."""
        return self._pool.submit(contextvars.copy_context().run, self._run, task)

    def remeasure(self, request: RemeasureRequest) -> RemeasuredResult:
        """The finalists timed together in a sandbox worker of its own (nothing else runs then)."""
        sandbox = new_pool()
        try:
            return remeasure_in_repo(request, sandbox)
        finally:
            sandbox.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for sandbox in self._sandboxes:
            sandbox.close()


# -- Ray -------------------------------------------------------------------------------------


def opset_files(repo: Repository, card_id: str) -> tuple[str, dict[str, bytes]]:
    """The relative folder of the opset holding ``card_id`` and its files (manifest included).
    Only a trusted opset is shipped: the node trusts what it receives (see :func:`evaluate_shipped`)."""
    from modulelens.ops import open_card
    from modulelens.repo import require_trusted

    art, _ = open_card(repo, card_id)
    require_trusted(art, "send its cards to Ray workers")
    folder = art.path
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    return folder.relative_to(repo.root).as_posix(), files


def _scratch_repository(opset_dir: str, files: dict[str, bytes]) -> Path:
    """A scratch repository on this node holding the shipped opset. The submitting side only ships
    opsets it trusts (:func:`opset_files`); another node's key differs, so the copy is signed with
    this node's key here, in a scratch repository nobody else reads. The caller removes it."""
    import tempfile

    from modulelens.repo import sign_folder

    scratch = Path(tempfile.mkdtemp(prefix="modulelens-ray-"))
    target = scratch / opset_dir
    for rel, data in files.items():
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        (target / rel).write_bytes(data)
    sign_folder(target)
    return scratch


def evaluate_shipped(task_json: str, opset_dir: str, files: dict[str, bytes]) -> str:
    """What a Ray task runs: rebuild the card's opset and the candidate in a scratch repository on
    this node, validate there (a sandbox worker of this node), and return the result as JSON."""
    import shutil

    from modulelens.kernels import save_candidate
    from modulelens.ops import open_card

    task = EvalTask.model_validate_json(task_json)
    scratch = _scratch_repository(opset_dir, files)
    try:
        repo = Repository(scratch)
        _, card = open_card(repo, task.settings.card_id)
        art = save_candidate(repo, card, task.source)
        local = task.model_copy(update={"repo": str(scratch), "candidate_id": art.ref})
        sandbox = new_pool()
        try:
            result = evaluate_in_repo(local, sandbox, f"ray:{socket.gethostname()}:{os.getpid()}")
        finally:
            sandbox.close()
        return result.model_copy(update={"report_ref": None}).model_dump_json()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def remeasure_shipped(request_json: str, opset_dir: str, files: dict[str, bytes]) -> str:
    """What a Ray task runs for the final re-measurement: the card's opset rebuilt in a scratch
    repository on this node (signed here, as in :func:`evaluate_shipped`), the finalists timed
    together in a sandbox worker of this node; the result as JSON."""
    import shutil


    request = RemeasureRequest.model_validate_json(request_json)
    scratch = _scratch_repository(opset_dir, files)
    try:
        sandbox = new_pool()
        try:
            result = remeasure_in_repo(request.model_copy(update={"repo": str(scratch)}), sandbox)
        finally:
            sandbox.close()
        return result.model_dump_json()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class RayExecutor:
    """Evaluations as Ray tasks on a cluster (or a local Ray instance)."""

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None, num_cpus: int | None = None):
        try:
            import ray
        except ImportError:
            raise ModuleLensError("the ray executor needs Ray, which is not installed",
                                  'pip install "modulelens[ray]" (or pip install ray), or use [--executor local]')
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            kwargs: dict = {"include_dashboard": False, "ignore_reinit_error": True, "log_to_driver": False}
            if address:
                kwargs["address"] = address
            elif num_cpus:
                kwargs["num_cpus"] = num_cpus
            try:
                ray.init(**kwargs)
            except ConnectionError as e:
                raise ModuleLensError(f"could not join the Ray cluster at {address}: {e}",
                                      "check [--address] (ray status on the head node prints it)")
        self.workers = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote = ray.remote(evaluate_shipped)
        self._files: dict[str, tuple[str, object]] = {}

    def submit(self, task: EvalTask) -> concurrent.futures.Future[EvalResult]:
        key = f"{task.repo}|{task.settings.card_id}"
        if key not in self._files:  # ship each opset once: Ray keeps it in its object store
            folder, files = opset_files(Repository(task.repo), task.settings.card_id)
            self._files[key] = (folder, self._ray.put(files))
        folder, files_ref = self._files[key]
        gpu = is_cuda(task.device)
        ref = self._remote.options(num_cpus=0 if gpu else 1, num_gpus=1 if gpu else 0).remote(
            task.model_dump_json(), folder, files_ref)
        out: concurrent.futures.Future[EvalResult] = concurrent.futures.Future()

        def done(fut: concurrent.futures.Future) -> None:
            try:
                out.set_result(EvalResult.model_validate_json(fut.result()))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting search
                out.set_exception(e)

        ref.future().add_done_callback(done)
        return out

    def remeasure(self, request: RemeasureRequest) -> RemeasuredResult:
        """The finalists timed together as one Ray task (one node, one worker)."""
        folder, files = opset_files(Repository(request.repo), request.card_id)
        gpu = is_cuda(request.device)
        remote = self._ray.remote(remeasure_shipped).options(num_cpus=0 if gpu else 1, num_gpus=1 if gpu else 0)
        return RemeasuredResult.model_validate_json(self._ray.get(remote.remote(request.model_dump_json(), folder,
                                                                                files)))

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()


def make_executor(name: str, workers: int, address: str | None) -> Executor:
    if name == "local":
        return LocalExecutor(workers)
    if name == "ray":
        return RayExecutor(address, workers=None if workers <= 1 and address else workers,
                           num_cpus=None if address else max(workers, 1))
    raise ModuleLensError(f"unknown executor {name!r}", "use local or ray")
