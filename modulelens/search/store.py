"""Searches and their node journals in the repository.

* ``searches/<search id>``: a :class:`SearchManifest` per version (v1 when the search starts, one
  more with the outcome at the end of each run; the latest is the search's state).
* ``search_nodes/<search id>.t<i>``: target ``i``'s tree; every version is one
  :class:`NodeRecord`, written atomically (the store's rename) when a node is dispatched and again
  when it completes. The tree is the latest record of each node id, so a node in flight when the
  process was killed reads back as ``pending`` with its candidate, and is evaluated again.
"""

from __future__ import annotations

import hashlib
import json

from modulelens.errors import ReferenceNotFound, tool_call
from modulelens.repo import Artifact, Repository
from modulelens.search.model import NODES, SEARCHES, NodeRecord, SearchManifest, SearchSettings, SearchTarget
from modulelens.search.tree import SearchTree


def search_key(targets: list[SearchTarget], settings: SearchSettings) -> str:
    """What identifies a search for a rerun: its targets, provider and backend."""
    text = json.dumps({"targets": [t.card_id for t in targets], "provider": settings.provider,
                       "backend": settings.backend}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def journal_name(search_id: str, target_index: int) -> str:
    return f"{search_id}.t{target_index}"


def open_search(repo: Repository, search_id: str) -> SearchManifest:
    """The latest state of the search ``search_id``; a clear error when there is none."""
    if not repo.versions(SEARCHES, search_id):
        known = repo.names(SEARCHES)
        raise ReferenceNotFound(f"no search named {search_id!r} in {repo.root}",
                                f"searches: {', '.join(known[-10:])}" if known else f"start one with {tool_call('optimize', targets=['blk/6'])}")
    return repo.open(SEARCHES, search_id).manifest_as(SearchManifest)


def find_search(repo: Repository, key: str) -> SearchManifest | None:
    """The most recently started search with this key, if any."""
    found = [m for m in (open_search(repo, name) for name in repo.names(SEARCHES)) if m.key == key]
    return max(found, key=lambda m: m.created_at) if found else None


def save_search(repo: Repository, manifest: SearchManifest) -> SearchManifest:
    art = repo.create(SEARCHES, manifest.search_id, lambda folder: manifest)
    return art.manifest_as(SearchManifest)


def write_node(repo: Repository, search_id: str, target_index: int, node: NodeRecord) -> NodeRecord:
    """Append the node's current state to its tree's journal (atomically)."""
    art: Artifact = repo.create(NODES, journal_name(search_id, target_index), lambda folder: node)
    return art.manifest_as(NodeRecord)


def load_tree(repo: Repository, search_id: str, target_index: int) -> SearchTree:
    """The tree of target ``target_index``: the latest record of each node (empty when none)."""
    name = journal_name(search_id, target_index)
    latest: dict[int, NodeRecord] = {}
    for version in repo.versions(NODES, name):
        record = repo.open(NODES, f"{name}:v{version}").manifest_as(NodeRecord)
        latest[record.node] = record
    return SearchTree(list(latest.values()))
