"""modulelens: isolate a PyTorch module from a real run, replay it alone, and work on it.

Python API (the same tools as the CLI and the MCP server)::

    import modulelens as ml
    with ml.capture("blocks.1", name="blk"):      # inside your own code
        model = build(); model(batch)
    ml.replay_module("blk")                       # -> ReplayModuleResult
    with ml.use_pack("model.pack"): train()       # validated kernels, exact guards
    ml.apply_pack(model, "model.pack")            # the same, for one model
"""

from __future__ import annotations

from typing import Any

from modulelens.prestart import maybe_prestart  # noqa: E402 - first, before torch: see its docstring
from modulelens.version import __version__  # noqa: F401 - the package's version

maybe_prestart()

from modulelens.capture import capture, record_constructors  # noqa: E402
from modulelens.dispatch.api import apply_pack, use_pack  # noqa: E402
from modulelens.errors import ModuleLensError  # noqa: E402


def _tool_function(name: str, **preset: Any):
    def call(*args: Any, repo: str | None = None, **kwargs: Any):
        from pathlib import Path

        from modulelens.registry import ToolContext
        from modulelens.repo import default_repo_root
        from modulelens.tools import get_tool

        tool = get_tool(name)
        fields = [n for n, f in tool.request.model_fields.items()
                  if (f.json_schema_extra or {}).get("cli") == "argument" and n not in preset]
        kwargs.update(preset, **dict(zip(fields, args)))
        ctx = ToolContext(repo_root=Path(repo) if repo else default_repo_root(), workdir=Path.cwd())
        return tool(tool.request(**kwargs), ctx)

    call.__name__ = name
    call.__doc__ = f"Run the {name} tool; keyword arguments are its request fields (see the CLI's --help)."
    if preset:
        call.__doc__ = f"Run the {name} tool with {preset}; other keyword arguments are its request fields."
    return call


capture_module = _tool_function("capture_module")
replay_module = _tool_function("replay_module")
list_captures = _tool_function("list", kind="captures")
show_capture = _tool_function("show", kind="captures")
export_repro = _tool_function("export_repro")
capture_ops = _tool_function("capture_ops")
profile = _tool_function("profile")
generate_kernel = _tool_function("generate_kernel")
validate_kernel = _tool_function("validate_kernel")
gather_stats = _tool_function("gather_stats")
pack = _tool_function("pack")
run = _tool_function("run")
check_pack = _tool_function("check_pack")
list_packs = _tool_function("list", kind="packs")
show_pack = _tool_function("show", kind="packs")
optimize = _tool_function("optimize")

__all__ = [
    "ModuleLensError",
    "apply_pack",
    "capture",
    "capture_module",
    "capture_ops",
    "check_pack",
    "export_repro",
    "gather_stats",
    "generate_kernel",
    "profile",
    "validate_kernel",
    "list_captures",
    "list_packs",
    "optimize",
    "pack",
    "record_constructors",
    "replay_module",
    "run",
    "show_capture",
    "show_pack",
    "use_pack",
]
