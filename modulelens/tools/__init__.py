"""One module per tool; importing this package registers them all (the order is the CLI's).

Tools never import each other: what two tools share lives in a domain package.
"""

from modulelens.tools import (  # noqa: F401, I001  (CLI order)
    capture_module,
    replay_module,
    list_captures,
    show_capture,
    tag_capture,
    trust_artifact,
    push,
    pull,
    export_repro,
    capture_ops,
    list_opsets,
    list_op_cards,
    show_op_card,
    replay_op_card,
    profile,
    generate_kernel,
    validate_kernel,
    optimize,
    show_search,
    add_search_child,
    validate_module,
    list_candidates,
    show_candidate,
    install_skills,
    gather_stats,
    list_stats_runs,
    show_stats_run,
    pack,
    run,
    check_pack,
    list_packs,
    show_pack,
)

from modulelens.errors import ModuleLensError  # noqa: E402
from modulelens.registry import Tool, registered  # noqa: E402


def all_tools() -> list[Tool]:
    """Every tool, in registration order (the CLI's and the MCP server's order)."""
    return registered()


def get_tool(name: str) -> Tool:
    """The tool called ``name``; a clear error names the known ones otherwise."""
    for tool in registered():
        if tool.name == name:
            return tool
    raise ModuleLensError(f"no tool named {name!r}", f"tools: {', '.join(t.name for t in registered())}")
