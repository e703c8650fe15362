"""Worker process for runs with a pack: ``python -m modulelens.dispatch.worker REQUEST.json RESULT.json``.

The user's script runs here, never in the caller's process (its own ``sys.argv``, ``__main__``
and stdout); see :mod:`modulelens.dispatch.script`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def _run(request: dict[str, Any]) -> dict[str, Any]:
    from modulelens.dispatch.script import ScriptRunRequest, run_in_worker

    return run_in_worker(ScriptRunRequest.model_validate(request)).model_dump(mode="json")


def main(argv: list[str]) -> None:
    from modulelens.capture.worker_process import worker_main

    worker_main(_run, Path(argv[0]), Path(argv[1]), "run")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
