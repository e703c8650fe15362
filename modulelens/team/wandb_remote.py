"""The W&B remote: push stored versions as W&B artifacts, download one back.

* Push logs one W&B run (job type ``modulelens-push``) that declares the pushed versions' inputs
  (``use_artifact``, when they were pushed before and the server can be asked) and logs one
  artifact per version: its type and name from :mod:`modulelens.team.model`, every file of the
  version (``manifest.json`` included, never the machine-local ``manifest.sig``), the manifest as
  metadata with our sha256 checksums and inputs under ``modulelens``, the local tags plus
  ``local-vN`` as aliases. W&B computes its own digests (base64 md5). ``WANDB_MODE=offline`` writes
  the run under ``WANDB_DIR`` for ``wandb sync``.
* Download asks W&B's public API for one version and fetches its files; the caller verifies them
  (:mod:`modulelens.team.importer`). A download needs a server, so it refuses offline mode.
* Credentials come only from W&B itself: ``WANDB_API_KEY``, ``WANDB_IDENTITY_TOKEN_FILE`` or
  ``wandb login`` (netrc). Nothing here reads, stores or prints a key; the run gets no config.
* Nothing is printed to stdout (it may be the MCP protocol): W&B runs silent, without console capture.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlparse

from modulelens.errors import ModuleLensError, tool_call
from modulelens.team.model import (
    DownloadedArtifact,
    PushedArtifact,
    PushItem,
    PushOutcome,
    RemoteAddress,
    kind_of_type,
    origin_alias,
    remote_name,
    remote_type,
)

_INSTALL_HINT = "pip install 'modulelens[wandb]'"
DEFAULT_HOST = "https://api.wandb.ai"


def import_wandb() -> ModuleType:
    """The ``wandb`` module, or a one-line error saying how to install it."""
    try:
        import wandb
    except ImportError:
        raise ModuleLensError("pushing to or pulling from W&B needs the wandb package", _INSTALL_HINT) from None
    return wandb


def is_offline() -> bool:
    """Whether W&B is set to log without a server (``WANDB_MODE=offline``, or ``dryrun``)."""
    return os.environ.get("WANDB_MODE", "").strip().lower() in ("offline", "dryrun")


def has_credentials() -> bool:
    """Whether W&B can authenticate without asking: a key or identity token in the environment, or
    a ``wandb login`` entry in netrc for ``WANDB_BASE_URL``'s host. The key itself is never read
    into modulelens (only whether netrc has an entry)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or DEFAULT_HOST).hostname or ""
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def require_credentials(action: str) -> None:
    if not has_credentials():
        raise ModuleLensError(
            f"no W&B credentials to {action}",
            "set WANDB_API_KEY in the environment or run `wandb login` (or WANDB_MODE=offline to push without a server)",
        )


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]


class WandbRemote:
    """One W&B project (``wandb://ENTITY/PROJECT``) as a team repository."""

    def __init__(self, project: RemoteAddress):
        self.project = project

    def _address(self, name: str, alias: str) -> RemoteAddress:
        return self.project.model_copy(update={"name": name, "alias": alias})

    # -- push -------------------------------------------------------------------------------
    def check_ready(self) -> None:
        import_wandb()
        if os.environ.get("WANDB_MODE", "").strip().lower() == "disabled":
            raise ModuleLensError("W&B is disabled (WANDB_MODE=disabled), so nothing can be pushed",
                                  "unset WANDB_MODE, or set it to offline to push into a local run folder")
        if not is_offline():
            require_credentials("push")

    def push(self, items: list[PushItem]) -> PushOutcome:
        self.check_ready()
        wandb = import_wandb()
        offline = is_offline()
        try:
            # mode and folder from the environment now, not from W&B's first setup in this process
            run = wandb.init(entity=self.project.entity, project=self.project.project, job_type="modulelens-push",
                             name=f"push {items[0].local.ref}", reinit="create_new",
                             mode="offline" if offline else "online", dir=os.environ.get("WANDB_DIR") or None,
                             settings=wandb.Settings(silent=True, console="off"))
        except Exception as e:  # W&B's own errors: bad entity, network, permission
            raise ModuleLensError(f"W&B refused the push run ({_first_line(e)})",
                                  "check the entity and project, and your W&B login") from None
        try:
            pushed = [self._log(wandb, run, item, offline) for item in items]
            where = str(Path(run.dir).parent) if offline else run.url
        finally:
            run.finish()
        return PushOutcome(pushed=pushed, run=where, offline=offline)

    def _log(self, wandb: ModuleType, run: Any, item: PushItem, offline: bool) -> PushedArtifact:
        used, unresolved = self._declare_inputs(run, item, offline)
        name = remote_name(item.local.kind, item.local.name)
        metadata = {**item.metadata, "modulelens": {"ref": item.local.ref, "kind": item.local.kind,
                                                    "sha256": item.files, "uses": [u.ref for u in item.uses]}}
        art = wandb.Artifact(name, type=remote_type(item.local.kind), metadata=metadata,
                             description=f"modulelens {item.local.kind} {item.local.ref}")
        folder = Path(item.folder)
        for rel in item.files:
            art.add_file(str(folder / rel), name=rel)
        try:
            run.log_artifact(art, aliases=item.aliases)
        except Exception as e:
            raise ModuleLensError(f"W&B refused artifact {name} ({_first_line(e)})",
                                  "check the project's permissions and your W&B login") from None
        return PushedArtifact(
            ref=item.local.ref, kind=item.local.kind, address=str(self._address(name, origin_alias(item.local.version))),
            type=remote_type(item.local.kind), aliases=item.aliases, files=len(item.files),
            bytes=sum((folder / rel).stat().st_size for rel in item.files), uses=used, unresolved_uses=unresolved)

    def _declare_inputs(self, run: Any, item: PushItem, offline: bool) -> tuple[list[str], list[str]]:
        """Declare each input the server already holds (by its ``local-vN`` alias) as used by the
        run; inputs that cannot be found (never pushed, or offline) are returned as unresolved."""
        used: list[str] = []
        unresolved: list[str] = []
        for use in item.uses:
            address = self._address(remote_name(use.kind, use.name), origin_alias(use.version))
            if offline:
                unresolved.append(str(address))
                continue
            try:
                run.use_artifact(address.path)
                used.append(str(address))
            except Exception:  # not pushed yet: the lineage stays in the metadata only
                unresolved.append(str(address))
        return used, unresolved

    # -- download ---------------------------------------------------------------------------
    def download(self, address: RemoteAddress, dest: str) -> DownloadedArtifact:
        wandb = import_wandb()
        if is_offline():
            raise ModuleLensError("pulling needs a W&B server, and WANDB_MODE is offline",
                                  "unset WANDB_MODE (or set it to online) to pull")
        require_credentials("pull")
        try:
            art = wandb.Api().artifact(address.path)
        except Exception as e:
            raise ModuleLensError(f"W&B has no artifact {address} ({_first_line(e)})",
                                  "check the name and alias: the artifact page in W&B shows them") from None
        kind = kind_of_type(art.type)
        if kind is None:
            raise ModuleLensError(f"{address} is a W&B artifact of type {art.type!r}, not a modulelens artifact",
                                  f"pull artifacts pushed by {tool_call('push')} (types modulelens-capture, ...)")
        try:
            art.download(root=dest)
        except Exception as e:
            raise ModuleLensError(f"downloading {address} failed ({_first_line(e)})", "try again") from None
        resolved = self._address(art.name.partition(":")[0], art.version)
        return DownloadedArtifact(address=str(resolved), kind=kind, folder=dest, aliases=list(art.aliases),
                                  digests={path: entry.digest for path, entry in art.manifest.entries.items()})

