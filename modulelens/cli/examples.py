"""One example command line per tool, shown at the end of the command's ``--help``.

Keyed by tool name; the value is what follows ``modulelens <command>``. The examples follow the
demo (``scripts/demo.sh``): capture ``blocks.1`` of the example transformer as ``demo-block``, then
work on its operator cards. ``tests/test_cli_help.py`` parses every example against its command and
request model, so an example cannot use an option that does not exist, and every tool needs one.
"""

from __future__ import annotations

__all__ = ["EXAMPLES", "example_line"]

EXAMPLES: dict[str, str] = {
    "capture_module": "examples/tinyformer/train.py --module blocks.1 --name demo-block -- --steps 3",
    "replay_module": "demo-block --strategy export",
    "list": "cards demo-block --op-kind memory --limit 5",
    "show": "captures demo-block:v1 --tensors",
    "tag_capture": "demo-block:v1 prod",
    "trust": "demo-block:v1",
    "push": "demo-block@prod --to wandb://my-team/kernels",
    "pull": "wandb://my-team/kernels/capture-demo-block:prod",
    "export_repro": "demo-block@prod --out repros",
    "capture_ops": "demo-block",
    "profile": "demo-block:v1/2 --min-run-time 1",
    "generate_kernel": "demo-block:v1/2 --backend cpp --provider template",
    "validate_kernel": "--source examples/tinyformer/fused_block.py --target demo-block --claims-training",
    "optimize": "demo-block:v1/2 demo-block:v1/4 --backend cpp --max-evals 12 --time-budget 600",
    "add_search_child": "opt-demo-block.card2-1a2b3c --parent 2 --source my_kernel.cpp",
    "install_skills": "path/to/your/project",
    "gather_stats": "examples/tinyformer/train.py --every 5 -- --steps 20",
    "pack": "demo-block.card2:v1 demo-block.module:v1 --out demo.pack",
    "run": "examples/tinyformer/train.py --pack demo.pack --compare -- --steps 6",
    "check_pack": "demo.pack --limit 4",
}


def example_line(tool_name: str, cli_name: str) -> str | None:
    """``modulelens <cli_name> <example>``, or None when the tool has no example."""
    args = EXAMPLES.get(tool_name)
    return None if args is None else f"modulelens {cli_name} {args}"
