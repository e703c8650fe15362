"""Push stored versions (or a pack file) to a team repository and pull them back: the one call each tool makes.

The remote is chosen by the address's scheme (:func:`remote_for`); a new kind of remote is one
more small module implementing :class:`~modulelens.team.model.Remote` and one line here.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from modulelens.repo import Repository
from modulelens.team.bundle import push_items
from modulelens.team.importer import import_folder, restore_tags
from modulelens.team.model import PulledArtifact, PushOutcome, Remote, RemoteAddress, parse_artifact, parse_project


def remote_for(address: RemoteAddress) -> Remote:
    """The remote that serves ``address``'s scheme (the address is already parsed, so known)."""
    from modulelens.team.wandb_remote import WandbRemote

    remotes: dict[str, type] = {"wandb": WandbRemote}
    return remotes[address.scheme](address)


def check_push_target(to: str) -> None:
    """Raise the one-line error a push to ``to`` would end with, without pushing (a malformed
    address, the remote's client missing, no credentials), so a long job can fail before it runs."""
    project = parse_project(to)
    remote_for(project).check_ready()


def push(repo: Repository, kind: str, ref: str, to: str) -> PushOutcome:
    """Push the version ``ref`` of ``kind`` (a candidate with its latest report; for packs, ``ref``
    may be a pack file, stored first) to the project ``to``."""
    project = parse_project(to)
    items = push_items(repo, kind, ref)
    return remote_for(project).push(items)


def pull(repo: Repository, address: str) -> PulledArtifact:
    """Fetch the artifact at ``address`` and store it, verified, as an untrusted local version with
    the remote's aliases that were tags where it was pushed as local tags."""
    source = parse_artifact(address)
    remote = remote_for(source)
    tmp_root = repo.root / ".tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pull-", dir=tmp_root) as tmp:
        fetched = remote.download(source, tmp)
        pulled = import_folder(repo, Path(fetched.folder), kind=fetched.kind, origin=fetched.address,
                               digests=fetched.digests)
    return restore_tags(repo, pulled, fetched.aliases)
