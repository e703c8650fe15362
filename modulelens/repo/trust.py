"""Trust in stored artifacts: a local signature over the whole manifest, and the review a user
sees before trusting an artifact that this machine did not write.

* The **key** is 32 random bytes in ``$MODULELENS_CONFIG_DIR`` (else ``$XDG_CONFIG_HOME/modulelens``,
  else ``~/.config/modulelens``) in the file ``key``, mode 0600, made on first use.
* :meth:`Repository.create <modulelens.repo.store.Repository.create>` writes ``manifest.sig``
  next to ``manifest.json``: HMAC-SHA256 with that key over the manifest file's exact bytes. The
  manifest holds the sha256 of every other file, so the signature covers the whole artifact; an
  edited manifest or file is no longer trusted.
* An artifact is **trusted** when its signature verifies with this machine's key. Artifacts
  copied or pulled from elsewhere, written before signatures existed, or edited are untrusted.
* Code that would import, unpickle or run anything from an artifact calls
  :func:`require_trusted` first. :func:`review` lists what could run (programs, scripts, class
  paths, files whose paths leave the artifact); :func:`trust` signs an artifact after the user
  has seen that review (the ``trust`` tool).
* A process that must not hold the key (the sandbox's checker, which reads what candidates wrote)
  calls :func:`forbid_key` and is told which artifacts its caller verified, by the sha256 of their
  manifest's exact bytes (:func:`accept_verified`): those, and only those, are trusted there.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from modulelens.errors import ModuleLensError, tool_call

SIGNATURE = "manifest.sig"
KEY_FILE = "key"
# Files whose loading can run code: export programs (pickled constants), pickles, scripts.
_CODE_SUFFIXES = {".pt2": "torch.export program (may hold pickled constants)", ".pkl": "pickle",
                  ".pickle": "pickle", ".pt": "torch.save file (pickle)", ".py": "Python source",
                  ".sh": "shell script", ".so": "shared library"}
_CLASS_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.<>]*$")


class UntrustedArtifact(ModuleLensError):
    """An artifact whose signature does not verify was asked to run code."""


def config_dir() -> Path:
    """Where the per-machine key lives."""
    base = os.environ.get("MODULELENS_CONFIG_DIR")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "modulelens"


_VERIFIED: dict[str, str] = {}
_KEYLESS: list[bool] = []


def forbid_key() -> None:
    """From now on this process neither reads nor makes a signing key: only artifacts given to
    :func:`accept_verified` are trusted, and signing raises."""
    _KEYLESS.append(True)


def accept_verified(path: Path, manifest_sha256: str) -> None:
    """Trust the artifact at ``path`` in this process while its manifest's bytes have this sha256
    (the caller checked its signature with the key this process does not hold)."""
    _VERIFIED[os.path.realpath(path)] = manifest_sha256


def verified_digest(path: Path, manifest_name: str = "manifest.json") -> str:
    """The sha256 of the artifact's manifest bytes, for :func:`accept_verified` in another process."""
    return hashlib.sha256((Path(path) / manifest_name).read_bytes()).hexdigest()


def machine_key() -> bytes:
    """This machine's signing key, made (0600) on first use."""
    if _KEYLESS:
        raise ModuleLensError("this process holds no signing key (it is the sandbox's checker)",
                              "sign in the tool process")
    path = config_dir() / KEY_FILE
    try:
        key = path.read_bytes()
        if len(key) >= 32:
            return key
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = secrets.token_bytes(32)
    tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    try:
        os.link(tmp, path)  # the first writer wins; a concurrent one reads the winner's key
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return path.read_bytes()


def signature_of(manifest_bytes: bytes) -> str:
    return hmac.new(machine_key(), manifest_bytes, hashlib.sha256).hexdigest()


def sign_folder(folder: Path, manifest_name: str = "manifest.json") -> None:
    """Write the signature of ``folder``'s manifest (used by Repository.create and :func:`trust`)."""
    (folder / SIGNATURE).write_text(signature_of((folder / manifest_name).read_bytes()))


def is_trusted(path: Path, manifest_name: str = "manifest.json") -> bool:
    """Whether the artifact folder ``path`` carries a valid signature of this machine (in a keyless
    process: whether its caller verified it, see :func:`accept_verified`)."""
    if _KEYLESS:
        want = _VERIFIED.get(os.path.realpath(path))
        try:
            return want is not None and hmac.compare_digest(want, verified_digest(path, manifest_name))
        except OSError:
            return False
    try:
        stored = (path / SIGNATURE).read_text().strip()
        manifest = (path / manifest_name).read_bytes()
    except OSError:
        return False
    return hmac.compare_digest(stored, signature_of(manifest))


def _kind(artifact: Any) -> str | None:
    """The kind argument of the trust tool for ``artifact`` (None: the default, captures)."""
    kind = getattr(artifact, "kind", "captures")
    return None if kind == "captures" else kind


def require_trusted(artifact: Any, action: str) -> None:
    """Raise :class:`UntrustedArtifact` unless ``artifact`` is trusted. ``action`` says what was
    refused: 'replay it', 'export a repro of it', ..."""
    if not is_trusted(artifact.path):
        raise UntrustedArtifact(
            f"{artifact.ref} is not trusted here (not written on this machine, or changed since), so modulelens "
            f"will not {action}: that would import, unpickle or run code stored in it",
            f"review what would run with {tool_call('trust', ref=artifact.ref, kind=_kind(artifact))}, then trust it "
            f"with {tool_call('trust', ref=artifact.ref, kind=_kind(artifact), yes=True)}",
        )


class TrustReview(BaseModel):
    """What trusting an artifact would allow to run."""

    ref: str
    trusted: bool = Field(description="Already trusted (valid signature of this machine).")
    code_files: dict[str, str] = Field(default_factory=dict, description="File -> why loading it can run code.")
    class_paths: list[str] = Field(default_factory=list, description="module:attribute paths replay would import.")
    escaping_paths: list[str] = Field(default_factory=list, description="Paths outside the artifact it names (files listed there are never read; folders named in the manifest may be imported from once trusted).")
    checksum_problems: list[str] = Field(default_factory=list)


def review(artifact: Any) -> TrustReview:
    """Everything in ``artifact`` that could run code once trusted, and what is wrong with it."""
    from modulelens.errors import ChecksumMismatch

    out = TrustReview(ref=artifact.ref, trusted=is_trusted(artifact.path))
    for rel in sorted(artifact.base.files):
        if not is_confined(artifact.path, rel):
            out.escaping_paths.append(rel)
            continue
        why = _CODE_SUFFIXES.get(Path(rel).suffix.lower())
        if why:
            out.code_files[rel] = why
        try:
            artifact.file(rel)
        except ChecksumMismatch as e:
            out.checksum_problems.append(e.message)
    seen: set[str] = set()
    _strings(artifact.raw_manifest, seen, out)
    out.class_paths = sorted(seen)
    return out


def _strings(value: Any, seen: set[str], out: TrustReview) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _strings(k, seen, out)
            _strings(v, seen, out)
    elif isinstance(value, list):
        for v in value:
            _strings(v, seen, out)
    elif isinstance(value, str):
        if _CLASS_PATH.match(value):
            seen.add(value)
        elif ("/" in value or value.endswith(".py")) and (value.startswith(("/", "..")) or "/../" in value):
            out.escaping_paths.append(value)


def trust(artifact: Any) -> TrustReview:
    """Sign ``artifact`` with this machine's key (after :func:`review`); refused when a file's
    checksum is wrong or a listed file lies outside the artifact."""
    found = review(artifact)
    bad = found.checksum_problems + [f"{p} leaves the artifact" for p in found.escaping_paths
                                     if p in artifact.base.files]
    if bad:
        raise ModuleLensError(f"{artifact.ref} cannot be trusted: {bad[0]}", "get an intact copy of the artifact")
    sign_folder(artifact.path)
    found.trusted = True
    return found


def is_confined(root: Path, rel: str) -> bool:
    """Whether ``rel`` names a path inside ``root`` (no absolute path, no ``..``, no symlink out)."""
    if not rel or os.path.isabs(rel) or "\\" in rel:
        return False
    try:
        return (root / rel).resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):
        return False
