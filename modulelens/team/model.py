"""The team repository's records: remote addresses, what a push sends, what a pull brings back.

Pure (no W&B, no file access), so every remote speaks the same records and the parsing is unit
tested on its own.

* An address is ``wandb://ENTITY/PROJECT`` (where :func:`parse_project` pushes to) or
  ``wandb://ENTITY/PROJECT/NAME[:ALIAS]`` (one artifact version :func:`parse_artifact` pulls;
  ``ALIAS`` defaults to ``latest``; W&B versions are aliases too: ``v0``, ``v1``, ...).
* Each repository kind is pushed as its own remote type and name (:data:`REMOTE_KINDS`):
  capture ``blk`` is ``capture-blk`` of type ``modulelens-capture``, its opset ``opset-blk``, the
  candidate ``blk.card6`` is ``candidate-blk.card6``, its report ``report-blk.card6.v1``, the stats
  run ``train`` is ``stats-train``, the pack ``model`` is ``pack-model`` (a capture and its opset share a local name, so the kind is part
  of the remote name).
* A pushed version also carries the alias ``local-vN`` (N: its version on the machine that pushed
  it), which is how a later push finds the remote artifact a new one was made from (lineage).
"""

from __future__ import annotations

import re
from typing import Literal, Protocol

from pydantic import BaseModel, Field

from modulelens.errors import InvalidName

SCHEMES = ("wandb",)
PushKind = Literal["captures", "opsets", "candidates", "reports", "stats", "packs"]
# repository kind -> the singular used in remote names and types
REMOTE_KINDS: dict[str, str] = {"captures": "capture", "opsets": "opset", "candidates": "candidate",
                                "reports": "report", "stats": "stats", "packs": "pack"}
TYPE_PREFIX = "modulelens-"
ORIGIN_ALIAS_PREFIX = "local-v"
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
_ALIAS = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_FORMS = "wandb://ENTITY/PROJECT to push, wandb://ENTITY/PROJECT/NAME:ALIAS to pull (e.g. wandb://my-team/kernels/capture-blk:latest)"


class RemoteAddress(BaseModel):
    """A parsed remote address: a project, or one artifact version in it."""

    scheme: str = "wandb"
    entity: str
    project: str
    name: str | None = Field(None, description="Remote artifact name (capture-blk); None for a project.")
    alias: str | None = Field(None, description="Alias or version of the artifact (latest, prod, v3).")

    def __str__(self) -> str:
        base = f"{self.scheme}://{self.entity}/{self.project}"
        return base if self.name is None else f"{base}/{self.name}:{self.alias or 'latest'}"

    @property
    def path(self) -> str:
        """``ENTITY/PROJECT/NAME:ALIAS`` as W&B's API names an artifact."""
        return f"{self.entity}/{self.project}/{self.name}:{self.alias or 'latest'}"


def _malformed(text: str, why: str) -> InvalidName:
    return InvalidName(f"malformed remote address {text!r}: {why}", f"use {_FORMS}")


def parse_address(text: str) -> RemoteAddress:
    """Parse either form of address; a one-line :class:`InvalidName` names what is wrong."""
    scheme, sep, rest = (text or "").strip().partition("://")
    if not sep or scheme not in SCHEMES:
        raise _malformed(text, f"the scheme must be one of {', '.join(s + '://' for s in SCHEMES)}")
    parts = rest.strip("/").split("/")
    if len(parts) not in (2, 3):
        raise _malformed(text, "expected ENTITY/PROJECT or ENTITY/PROJECT/NAME:ALIAS after the scheme")
    name = alias = None
    if len(parts) == 3:
        name, _, alias = parts[2].partition(":")
        alias = alias or "latest"
        if not _ALIAS.match(alias):
            raise _malformed(text, f"invalid alias {alias!r}")
    for what, value in (("entity", parts[0]), ("project", parts[1]), ("artifact name", name)):
        if value is not None and (not _PART.match(value) or ".." in value):
            raise _malformed(text, f"invalid {what} {value!r}")
    return RemoteAddress(scheme=scheme, entity=parts[0], project=parts[1], name=name, alias=alias)


def parse_project(text: str) -> RemoteAddress:
    """A push target: ``wandb://ENTITY/PROJECT``."""
    address = parse_address(text)
    if address.name is not None:
        raise _malformed(text, "push to a project (wandb://ENTITY/PROJECT); the artifact name comes from the reference")
    return address


def parse_artifact(text: str) -> RemoteAddress:
    """A pull source: ``wandb://ENTITY/PROJECT/NAME[:ALIAS]``."""
    address = parse_address(text)
    if address.name is None:
        raise _malformed(text, "name the artifact to pull (wandb://ENTITY/PROJECT/NAME:ALIAS)")
    return address


def remote_name(kind: str, name: str) -> str:
    """The remote artifact name of local ``name`` of ``kind`` (``capture-blk``)."""
    return f"{REMOTE_KINDS[kind]}-{name}"


def remote_type(kind: str) -> str:
    """The remote artifact type of ``kind`` (``modulelens-capture``)."""
    return TYPE_PREFIX + REMOTE_KINDS[kind]


def kind_of_type(remote: str) -> str | None:
    """The repository kind a remote artifact type holds, or None when it is not a modulelens type."""
    singular = remote.removeprefix(TYPE_PREFIX) if remote.startswith(TYPE_PREFIX) else None
    return next((kind for kind, s in REMOTE_KINDS.items() if s == singular), None)


def is_local_tag(alias: str) -> bool:
    """Whether a remote alias was a local tag when pushed (not ``latest``, ``local-vN`` or W&B's ``vN``)."""
    return alias != "latest" and not re.fullmatch(rf"(?:{re.escape(ORIGIN_ALIAS_PREFIX)}|v)\d+", alias)


def origin_alias(version: int) -> str:
    """The alias a pushed version carries to name its version on the pushing machine."""
    return f"{ORIGIN_ALIAS_PREFIX}{version}"


class LocalRef(BaseModel):
    """One stored version, named by kind and ``name:vN``."""

    kind: str
    ref: str
    name: str
    version: int


class PushItem(BaseModel):
    """One stored version to push: its folder, the files to send (with their sha256), its aliases
    and the versions it was made from."""

    local: LocalRef
    folder: str = Field(description="The version's folder in the local repository.")
    files: dict[str, str] = Field(description="Relative path -> sha256 of every file sent (manifest.json included).")
    aliases: list[str] = Field(default_factory=list, description="Local tags pointing at it, plus local-vN.")
    metadata: dict = Field(default_factory=dict, description="The manifest, as remote metadata.")
    uses: list[LocalRef] = Field(default_factory=list, description="The stored versions it was made from.")


class PushedArtifact(BaseModel):
    """What one push left on the remote."""

    ref: str = Field(description="Local reference pushed (name:vN).")
    kind: str
    address: str = Field(description="Where to pull it from: wandb://ENTITY/PROJECT/NAME:ALIAS.")
    type: str = Field(description="Remote artifact type.")
    aliases: list[str]
    files: int
    bytes: int
    uses: list[str] = Field(default_factory=list, description="Remote artifacts recorded as its inputs (lineage).")
    unresolved_uses: list[str] = Field(default_factory=list,
                                       description="Local inputs not found on the remote (not pushed yet, or offline).")


class PushOutcome(BaseModel):
    """One push: the artifacts sent, in order, and the remote run that sent them."""

    pushed: list[PushedArtifact]
    run: str = Field(description="The remote run's URL, or its local folder in offline mode.")
    offline: bool = Field(False, description="Logged offline: sync the run folder (wandb sync) to upload it.")


class DownloadedArtifact(BaseModel):
    """One remote version fetched into a local folder, before it is imported."""

    address: str = Field(description="The resolved address (with the remote's version).")
    kind: str
    folder: str
    digests: dict[str, str] = Field(default_factory=dict,
                                    description="Relative path -> the remote's digest (base64 md5) of each file.")
    aliases: list[str] = Field(default_factory=list)


class PulledArtifact(BaseModel):
    """A remote version registered in the local repository."""

    ref: str = Field(description="Local reference it was stored as (name:vN).")
    kind: str
    origin: str = Field(description="The remote address it came from.")
    origin_ref: str = Field(description="Its reference on the machine that pushed it.")
    path: str = Field("", description="Its folder; for a pack, the file for --pack.")
    files: int
    trusted: bool = Field(False, description="Pulled artifacts are untrusted until `modulelens trust REF --yes`.")
    already_present: bool = Field(False, description="An identical version was already stored; nothing was added.")
    tags: list[str] = Field(default_factory=list, description="Remote aliases set as local tags.")
    tags_not_set: list[str] = Field(default_factory=list, description="Tags left alone here, and why.")
    next_step: str = ""


class Remote(Protocol):
    """A team repository: one small class per scheme (``wandb_remote.WandbRemote``)."""

    def check_ready(self) -> None:
        """Raise a one-line error when a push could not start (client missing, no credentials)."""
        ...

    def push(self, items: list[PushItem]) -> PushOutcome:
        """Send every item (inputs before the items that use them), one remote version each."""
        ...

    def download(self, address: RemoteAddress, dest: str) -> DownloadedArtifact:
        """Fetch one version's files into the empty folder ``dest``, with the remote's digests of them
        (the caller verifies the files: :func:`modulelens.team.importer.import_folder`)."""
        ...
