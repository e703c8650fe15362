"""Worker process for runs with a pack: ``python -m modulelens.dispatch.worker REQUEST.json OUT_DIR``.

The user's script runs here, never in the caller's process (its own ``sys.argv``, ``__main__``
and stdout); see :mod:`modulelens.dispatch.script`.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    from modulelens.dispatch.script import ScriptRunRequest, run_in_worker
    from modulelens.workers import worker_main

    worker_main(run_in_worker, argv, "run", ScriptRunRequest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
