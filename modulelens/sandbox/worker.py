"""The sandbox worker process: ``python -m modulelens.sandbox.worker RUNNER TASK_FD RESULT_FD MEMORY_MB``.

``RUNNER`` is the ``package.module:NAME`` of the :class:`~modulelens.sandbox.worker_messages.TaskRunner`
that does the tasks, named by the pool's caller (:class:`~modulelens.sandbox.worker_messages.WorkerKind`)
and only ever inside modulelens. Reads tasks from TASK_FD, reports stages and results on RESULT_FD.
Its own stdout and stderr are files chosen by the parent, so anything a candidate prints lands
there, never in a protocol.
"""

from __future__ import annotations

import importlib
import os
import resource
import sys
import traceback
from typing import Any


def _limit_memory(megabytes: int) -> None:
    if megabytes > 0:
        limit = megabytes * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def load_runner(path: str) -> Any:
    """The object ``path`` (``package.module:NAME``, a module inside modulelens) names."""
    module, _, name = path.partition(":")
    if not (module.startswith("modulelens.") and name.isidentifier()):
        raise ValueError(f"a task runner must be modulelens.<module>:<NAME>, not {path!r}")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str]) -> int:
    runner_path, task_fd, result_fd, memory_mb = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    import torch  # noqa: F401  (import before the limit: the limit is for what candidates allocate)

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton kernels are defined
        _limit_memory(memory_mb)  # address-space limits break CUDA; GPU runs rely on the device's memory
    runner = load_runner(runner_path)
    from modulelens.sandbox import protocol
    from modulelens.sandbox.worker_messages import InternalErrorResult, StageReport

    def stage(name: str) -> None:
        protocol.send(result_fd, StageReport(stage=name))

    while True:
        try:
            task = protocol.receive(task_fd, runner.tasks)
            if task is None:
                return 0
            result = runner.run(task, stage)
        except BaseException as e:  # noqa: BLE001 - the parent must always get an answer
            result = InternalErrorResult(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
        protocol.send(result_fd, result)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
