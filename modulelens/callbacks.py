"""The callback types that callers hand down to the layers below them (a leaf: imports nothing).

A front end makes them (the CLI's progress bar, an MCP progress notification, the MCP client's
model); the tool context carries them (:class:`modulelens.registry.ToolContext`); the code that does
the work (profiling, validation, search, generation) calls them without knowing who listens.
"""

from __future__ import annotations

from collections.abc import Callable

ProgressFn = Callable[[float, float | None, str | None], None]
"""``progress(done, total, message)``: ``total`` None when unknown, ``message`` None for none."""

SampleFn = Callable[[str, str, int], tuple[str, str]]
"""``sample(system prompt, user prompt, max tokens) -> (reply text, model name)``: asks the model of
the connected MCP client (MCP sampling)."""
