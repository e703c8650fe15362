"""What a finished job came to, for the Jobs page: one line in words (a verdict and its reason, a
match, what was stored) and the page of what it made or checked, for every tool a job can run,
whoever started it (the UI's actions, an agent's ``start_job``, the CLI). Read from the tool's
result as the job recorded it (JSON); a result without the expected fields gets a plain "done"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from modulelens.ui.render import seconds


@dataclass(frozen=True)
class JobOutcome:
    text: str
    good: bool
    link: str | None = None  # the page of the result (a path of this UI)


def _page(route: str, ref: Any) -> str | None:
    return f"/{route}/{quote(str(ref), safe='')}" if ref else None


def _speedup(r: dict[str, Any]) -> str:
    s = r.get("speedup_vs_eager")
    return f" · speedup vs eager {s:.2f}×" if isinstance(s, int | float) else ""


def _validated(r: dict[str, Any]) -> JobOutcome:
    return JobOutcome(f"{r.get('verdict', '?')}: {r.get('reason', '')}{_speedup(r)}", r.get("verdict") != "rejected",
                      _page("candidates", r.get("candidate_id")))


def _generated(r: dict[str, Any]) -> JobOutcome:
    v = r.get("validation") or {}
    said = f" · {v.get('verdict')}: {v.get('reason', '')}{_speedup(v)}" if v.get("verdict") else " (not validated)"
    return JobOutcome(f"generated {r.get('candidate_id')}{said}", v.get("verdict") != "rejected",
                      _page("candidates", r.get("candidate_id")))


def _replayed(r: dict[str, Any]) -> JobOutcome:
    if r.get("compared") is False:
        head, good = "ran (outputs not comparable: inputs were synthesised)", True
    else:
        head = "exact: bit-for-bit the captured outputs" if r.get("exact") else "match (allclose)" if r.get("match") else "MISMATCH"
        good = bool(r.get("match"))
    err = r.get("max_abs_error")
    tail = f" · max abs error {err:.3g}" if isinstance(err, int | float) else ""
    return JobOutcome(head + tail, good, _page("captures", r.get("ref")) if r.get("ref") else None)


def _captured(r: dict[str, Any]) -> JobOutcome:
    refs = r.get("captures") or ([r["ref"]] if r.get("ref") else [])
    return JobOutcome(f"captured {', '.join(refs)}" if refs else "captured", bool(refs), _page("captures", refs[0] if refs else None))


def _recorded(r: dict[str, Any]) -> JobOutcome:
    cards = r.get("cards") or []
    return JobOutcome(f"recorded {r.get('opset')}: {len(cards)} operator cards listed", True, _page("cards", r.get("opset")))


def _gathered(r: dict[str, Any]) -> JobOutcome:
    n = len(r.get("findings") or [])
    return JobOutcome(f"stored {r.get('run_id')} · {n} finding{'' if n == 1 else 's'}", n == 0, _page("stats", r.get("run_id")))


def _searched(r: dict[str, Any]) -> JobOutcome:
    targets = r.get("targets") or []
    found = sum(1 for t in targets if isinstance(t, dict) and t.get("best_candidate"))
    return JobOutcome(f"search {r.get('search_id')}: {r.get('evaluations')} evaluations, best found for {found} of "
                      f"{len(targets)} target(s) · stopped: {r.get('stopped_because')}", found > 0,
                      _page("searches", r.get("search_id")))


def _profiled(r: dict[str, Any]) -> JobOutcome:
    target, kind = r.get("target"), r.get("target_kind")
    link = (_page("captures", target) if kind == "capture" else _page("candidates", target) if kind == "candidate"
            else _page("cards", str(target).rsplit("/", 1)[0]) if kind == "card" and target else None)
    return JobOutcome(f"{target}: median {seconds(r.get('median_s'))} (p20 {seconds(r.get('p20_s'))}, "
                      f"p80 {seconds(r.get('p80_s'))})", True, link)


def _exported(r: dict[str, Any]) -> JobOutcome:
    checked = {True: "checked: reproduces the capture", False: "check failed", None: "not checked"}[r.get("verified")]
    return JobOutcome(f"wrote {r.get('path')} ({checked})", r.get("verified") is not False, _page("captures", r.get("ref")))


def _ran(r: dict[str, Any]) -> JobOutcome:
    return JobOutcome(r.get("summary") or "ran", not r.get("exit_code") and r.get("outputs_match") is not False, "/packs")


def _checked(r: dict[str, Any]) -> JobOutcome:
    return JobOutcome(r.get("summary") or "checked", bool(r.get("ok")), "/packs")


_BY_TOOL = {"validate_kernel": _validated, "generate_kernel": _generated, "replay_module": _replayed,
            "capture_module": _captured, "capture_ops": _recorded, "gather_stats": _gathered, "optimize": _searched,
            "profile": _profiled, "export_repro": _exported, "run": _ran, "check_pack": _checked}


def job_outcome(tool: str, result: dict[str, Any] | None) -> JobOutcome | None:
    """What the finished job of ``tool`` with ``result`` came to (None: no result)."""
    if result is None:
        return None
    read = _BY_TOOL.get(tool)
    try:
        return read(result) if read else JobOutcome(str(result.get("summary") or "done"), True)
    except (KeyError, TypeError, ValueError, AttributeError):
        return JobOutcome("done", True)
