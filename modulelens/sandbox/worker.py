"""The sandbox worker process: ``python -m modulelens.sandbox.worker TASK_FD RESULT_FD MEMORY_MB``.

Reads tasks from TASK_FD, reports stages and results on RESULT_FD. Its own stdout and stderr are
files chosen by the parent, so anything a candidate prints lands there, never in a protocol.
"""

from __future__ import annotations

import os
import resource
import sys
import traceback


def _limit_memory(megabytes: int) -> None:
    if megabytes > 0:
        limit = megabytes * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main(argv: list[str]) -> int:
    task_fd, result_fd, memory_mb = int(argv[0]), int(argv[1]), int(argv[2])
    import torch  # noqa: F401  (import before the limit: the limit is for what candidates allocate)

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton kernels are defined
        _limit_memory(memory_mb)  # address-space limits break CUDA; GPU runs rely on the device's memory
    from modulelens.sandbox import protocol
    from modulelens.validation import card as validate
    from modulelens.validation.messages import TASKS, InternalErrorResult, StageReport, TaskDone, ValidateModuleTask

    def stage(name: str) -> None:
        protocol.send(result_fd, StageReport(stage=name))

    while True:
        try:
            task = protocol.receive(task_fd, TASKS)
            if task is None:
                return 0
            if isinstance(task, ValidateModuleTask):
                from modulelens.validation import (
                    module as module_validate,  # only workers that validate modules need it
                )

                run = module_validate.run_task
            else:
                run = validate.run_task
            result = run(task, stage)
        except BaseException as e:  # noqa: BLE001 - the parent must always get an answer
            result = InternalErrorResult(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
        protocol.send(result_fd, TaskDone(result=result))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
