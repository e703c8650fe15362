"""Worker process for statistics over a script: ``python -m modulelens.stats.worker REQUEST.json OUT_DIR``.

The user's script runs here unmodified, as ``__main__``, with a :class:`StatsCollector` installed
(root model found at its first top-level call). The run ends when the script does, or after
``steps`` optimizer steps (:class:`StopRun` out of ``optimizer.step()``). The worker stores the
statistics in the repository and writes ``OUT_DIR/result.json``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from modulelens.errors import CaptureFailed


def _count_compile_calls() -> list[int]:
    """Wrap ``torch.compile`` to count calls (``nn.Module.compile`` goes through it too)."""
    import torch

    counter = [0]
    original = torch.compile

    def compile(*args: Any, **kwargs: Any) -> Any:  # noqa: A001 - same name as the wrapped function
        counter[0] += 1
        return original(*args, **kwargs)

    compile.__wrapped__ = original  # type: ignore[attr-defined]
    compile.__doc__ = original.__doc__
    torch.compile = compile  # type: ignore[assignment]
    return counter


def run(request: dict[str, Any]) -> dict[str, Any]:
    import torch

    from modulelens.capture.runner import run_user_file, script_error
    from modulelens.stats.collector import StatsCollector, StopRun

    eager = request.get("eager", True)
    if eager:
        os.environ["TORCHDYNAMO_DISABLE"] = "1"  # for processes the script starts
        try:
            import torch._dynamo

            torch._dynamo.config.disable = True
        except Exception:  # noqa: BLE001 - older/stripped builds: the env variable still applies
            pass
    compiles = _count_compile_calls()
    script = Path(request["script"]).resolve()
    collector = StatsCollector(
        every=request["every"], max_steps=request.get("steps"), step_on=request.get("step_on", "optimizer"),
        params=request.get("params", True), fx=request.get("fx", True), ema=request.get("ema", 0.9),
        plots=request.get("plots", True), thresholds=request.get("thresholds") or {}, sample=request.get("sample") or None,
    )
    stop_at = request.get("stop_at")
    if stop_at:  # end at a step boundary before the caller's hard limit, keeping the statistics
        collector.deadline = time.monotonic() + (stop_at - time.time())
    collector.start()
    try:
        error = run_user_file(script, request["script_args"], stop=StopRun)
    finally:
        collector.stop()
    notes: list[str] = []
    if compiles[0]:
        if eager:
            notes.append(
                f"the script called torch.compile {compiles[0]} time(s); it ran in eager mode instead (torch.compile "
                "disabled) because module hooks do not run inside compiled code: the statistics describe the same "
                "model computed eagerly. Pass --no-eager to keep torch.compile (then its submodules are not observed)."
            )
        else:
            notes.append(
                f"the script called torch.compile {compiles[0]} time(s) and --no-eager kept it: submodules inside "
                "compiled code are not observed."
            )
    if not collector.records:
        if error is not None:
            raise script_error(error, script)
        raise CaptureFailed(
            "the run ended before any module of the model was called on a sampled step",
            "check that the script trains a model (its forward must run with gradients enabled, or use "
            "--step-on forward for loops without an optimizer)",
        )
    if error is not None:
        where = script_error(error, script).message
        notes.append(f"the script stopped early: {where}; statistics cover the steps before it")
    collector.notes.extend(notes)
    art = collector.save(
        request["name"], request["repo"],
        kind="script", script=str(script), argv=request["script_args"], every=request["every"],
        steps=request.get("steps"),
    )
    return {"ref": art.ref, "steps_seen": collector.steps_seen}


def main(argv: list[str]) -> None:
    from modulelens.capture.runner import worker_main

    worker_main(run, Path(argv[0]), Path(argv[1]) / "result.json", "statistics")

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
