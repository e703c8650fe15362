"""The module tree a capture page draws, from what the capture records: the captured module's
qualified name (its ancestors in the model), its class, and the names of its weights (its own
submodules and their parameters and buffers)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

NodeRole = Literal["ancestor", "captured", "inside"]


@dataclass(frozen=True)
class ParamLeaf:
    name: str
    shape: list[int]
    dtype: str


@dataclass
class TreeNode:
    """One module: ``path`` is its qualified name in the model ('' for the root)."""

    name: str
    path: str
    role: NodeRole
    class_name: str = ""
    params: list[ParamLeaf] = field(default_factory=list)
    children: list[TreeNode] = field(default_factory=list)

    def child(self, name: str) -> TreeNode:
        for c in self.children:
            if c.name == name:
                return c
        path = f"{self.path}.{name}" if self.path else name
        node = TreeNode(name, path, "inside")
        self.children.append(node)
        return node


def module_tree(module_path: str, class_path: str, weights: Iterable[ParamLeaf]) -> TreeNode:
    """The model's root, the captured module's ancestors down to it (role ``ancestor``), the
    captured module (role ``captured``, with its class name), and below it the submodules its
    weight names imply (``attn.qkv.weight`` -> submodule ``attn.qkv``, parameter ``weight``)."""
    class_name = class_path.rpartition(":")[2] or class_path
    parts = [p for p in module_path.split(".") if p] if module_path else []
    root = TreeNode("model", "", "captured" if not parts else "ancestor")
    node = root
    for part in parts:
        node = node.child(part)
        node.role = "ancestor"
    node.role = "captured"
    node.class_name = class_name
    for leaf in weights:
        owner = node
        *mods, pname = leaf.name.split(".")
        for m in mods:
            owner = owner.child(m)
        owner.params.append(ParamLeaf(pname, leaf.shape, leaf.dtype))
    return root


def search_tree(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The nodes of one search target (dicts with ``node`` and ``parent``, as ``show`` gives them)
    nested: each node with its ``children``, in the order given; a node whose parent is not among
    them (a list cut short) hangs at the top level."""
    by_id = {n["node"]: {**n, "children": []} for n in nodes}
    top: list[dict[str, Any]] = []
    for n in nodes:
        parent = by_id.get(n.get("parent"))
        (parent["children"] if parent is not None else top).append(by_id[n["node"]])
    return top
