"""How long the web UI takes to load a page, with 100 captures in the repository (goal: under 1 s).

    python benchmarks/ui_page_load.py [--captures 100] [--repeats 7] [--no-browser]

One run: capture blocks.1 of the example transformer and record its operator cards (capture_ops),
then copy that capture and its opset under new names until the repository holds ``--captures`` of
each (copies of a real capture: the same files, manifests renamed). The UI is served by uvicorn on a
free loopback port, as ``modulelens ui`` does, and each page is loaded ``--repeats`` times after one
warm-up load (which also measures the machine's copy bandwidth once, for the rooflines):

- HTTP: wall time of ``GET`` until the whole HTML is read (urllib, no cache);
- browser: headless Chromium (Debian's ``chromium``, driven by playwright when both are installed):
  navigation start to the end of the ``load`` event, scripts run and styles applied.

The figure is the median (and the slowest) per page. Writes Markdown to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from report import publish  # noqa: E402

from modulelens.registry import ToolContext  # noqa: E402
from modulelens.tools import get_tool  # noqa: E402
from modulelens.ui.server import UiServer  # noqa: E402

GOAL_S = 1.0


def build_repository(root: Path, count: int) -> tuple[str, str]:
    """A repository with ``count`` captures and ``count`` opsets; returns (one capture, one opset)."""
    tool = get_tool("capture_ops")
    train = ROOT / "examples" / "tinyformer" / "train.py"
    result = tool(tool.request(ref=str(train), module="blocks.1", script_args=["--steps", "2"]),
                  ToolContext(repo_root=root))
    name = result.capture.split(":")[0]
    for kind in ("captures", "opsets"):
        source = root / kind / name
        for i in range(count - 1):
            copy = root / kind / f"copy{i:03d}"
            shutil.copytree(source, copy)
            manifest_path = copy / "v1" / "manifest.json"
            manifest = json.loads(manifest_path.read_text())
            manifest.update(name=copy.name, ref=f"{copy.name}:v1")
            manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return result.capture, result.opset


def http_load(url: str) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
        assert r.status == 200 and body
    return time.perf_counter() - t0


def browser_loader():
    """A function url -> seconds from navigation start to the end of the load event, or None
    when Chromium or playwright is missing."""
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None, None
    if chromium is None:
        return None, None
    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
    page = browser.new_page(viewport={"width": 1400, "height": 900})

    def load(url: str) -> float:
        page.goto(url, wait_until="load")
        return page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd") / 1000.0

    def close() -> None:
        browser.close()
        pw.stop()

    return load, close


def summarize(times: list[float]) -> str:
    return f"{statistics.median(times) * 1e3:.0f} ms (max {max(times) * 1e3:.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--captures", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="ml-bench-ui-"))
    try:
        capture, opset = build_repository(root, args.captures)
        pages = {
            "captures list (/)": "/",
            "one capture (tree, tensor statistics)": f"/captures/{capture}",
            "operator-card sets (/cards)": "/cards",
            "one opset's cards (rooflines)": f"/cards/{opset}",
            "candidates": "/candidates",
            "training statistics": "/stats",
        }
        load, close = (None, None) if args.no_browser else browser_loader()
        rows = []
        with UiServer(root, port=0) as server:
            base = server.url.rstrip("/")
            with urllib.request.urlopen(base + "/", timeout=60) as r:
                html = r.read().decode()
            assert "copy000" in html and capture.split(":")[0] in html, "the captures page does not list them"
            for label, path in pages.items():
                http_load(base + path)  # warm-up
                http = [http_load(base + path) for _ in range(args.repeats)]
                if load is not None:
                    load(base + path)
                    browser = [load(base + path) for _ in range(args.repeats)]
                else:
                    browser = None
                rows.append((label, http, browser))
        if close is not None:
            close()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    worst = max(statistics.median(b or h) for _, h, b in rows)
    lines = [
        "# UI page load",
        "",
        f"{args.captures} captures and {args.captures} opsets in the repository (copies of blocks.1 of the "
        f"example transformer); median of {args.repeats} loads after a warm-up, served by uvicorn on loopback.",
        "",
        "| page | HTTP (whole HTML) | browser (navigation to load event) |",
        "| --- | --- | --- |",
    ]
    for label, http, browser in rows:
        lines.append(f"| {label} | {summarize(http)} | {summarize(browser) if browser else 'n/a (no chromium)'} |")
    lines += ["", f"Slowest page (median, browser when measured): {worst * 1e3:.0f} ms; goal under "
              f"{GOAL_S * 1e3:.0f} ms: {'met' if worst < GOAL_S else 'NOT met'}. The max column is the single "
              "slowest load, which on a shared machine mostly measures other processes.",
              f"Python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d')}."]
    publish("ui_page_load", lines)


if __name__ == "__main__":
    main()
