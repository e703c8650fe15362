"""One module per tool, each declared with :func:`modulelens.registry.tool`; :func:`all_tools` is the
one place that gathers them into the registry the front ends receive (its order is the CLI's and
the MCP server's).

Tools never import each other: what two tools share lives in a domain package.
"""

from __future__ import annotations

from functools import cache

from modulelens.registry import Tool, ToolRegistry


@cache
def all_tools() -> ToolRegistry:
    """Every tool, in the CLI's and the MCP server's order."""
    from modulelens.tools import (
        add_search_child,
        capture_module,
        capture_ops,
        check_pack,
        export_repro,
        gather_stats,
        generate_kernel,
        install_skills,
        lists,
        optimize,
        pack,
        profile,
        pull,
        push,
        replay_module,
        run,
        show,
        tag_capture,
        trust_artifact,
        validate_kernel,
    )

    return ToolRegistry([
        capture_module.capture_module,
        replay_module.replay_module,
        lists.list_,
        show.show,
        tag_capture.tag_capture,
        trust_artifact.trust,
        push.push,
        pull.pull,
        export_repro.export_repro,
        capture_ops.capture_ops,
        profile.profile,
        generate_kernel.generate_kernel,
        validate_kernel.validate_kernel,
        optimize.optimize,
        add_search_child.add_search_child,
        install_skills.install_skills,
        gather_stats.gather_stats,
        pack.pack,
        run.run,
        check_pack.check_pack,
    ])


def get_tool(name: str) -> Tool:
    """The tool called ``name``; a clear error names the known ones otherwise."""
    return all_tools().get(name)
