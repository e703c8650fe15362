"""Worker process for script captures: ``python -m modulelens.capture.worker REQUEST.json OUT_DIR``.

The user's script runs here, never in the caller's process: it gets its own ``sys.argv``,
``__main__`` and stdout (which the caller relays or keeps, so an MCP server's protocol stream is
never written to), and the process simply ends after the capture. Under ``torchrun`` every rank
runs this worker; each writes ``OUT_DIR/result-rank<R>.json``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from modulelens.errors import ModuleLensError


def _ranks(spec: str, world: int) -> set[int]:
    if spec.strip() == "all":
        return set(range(world))
    try:
        return {int(x) for x in spec.split(",") if x.strip()}
    except ValueError as e:
        raise ModuleLensError(f"invalid ranks {spec!r}", "use 'all' or a comma-separated list like '0,1'") from e


def run(request: dict[str, Any]) -> dict[str, Any]:
    from modulelens.capture.artifact import save_capture
    from modulelens.capture.runner import run_and_capture, script_error
    from modulelens.capture.tracer import TraceOptions
    from modulelens.repo import Repository

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    record = rank in _ranks(request["ranks"], world)
    options = TraceOptions(
        target=request["module"],
        call_index=request["call"],
        backward=request["backward"],
        export=request["export"] and record,
        max_tensor_bytes=request["max_tensor_bytes"],
        record=record,
    )
    script = Path(request["script"]).resolve()
    tracer, captured, error = run_and_capture(
        script=script, script_args=request["script_args"], kind=request["kind"], options=options
    )
    base = {"rank": rank, "world_size": world, "recorded": record}
    if not record:
        return base
    if captured is None:
        raise script_error(error, script) if error is not None else tracer.no_match_error()
    name = request["name"]
    if world > 1 and len(_ranks(request["ranks"], world)) > 1:
        name = f"{name}-rank{rank}"
    notes = []
    if error is not None:
        notes.append(f"the script ended with {type(error).__name__} after the capture: {error}")
    art = save_capture(
        Repository(request["repo"]),
        name,
        captured,
        target=request["module"],
        source={
            "kind": request["kind"],
            "script": str(script),
            "argv": request["script_args"],
            "cwd": os.getcwd(),
        },
        pickle_module=request["pickle"],
        extra_sys_path=[str(script.parent), os.getcwd()],
        distributed={"rank": rank, "world_size": world, "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}
        if world > 1 or "RANK" in os.environ
        else None,
    )
    return {**base, "ref": art.ref, "notes": notes}


def main(argv: list[str]) -> None:
    from modulelens.capture.runner import worker_main

    rank = os.environ.get("RANK", "0")
    worker_main(run, Path(argv[0]), Path(argv[1]) / f"result-rank{rank}.json", "capture")

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
