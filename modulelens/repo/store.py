"""Local directory backend of the artifact repository.

Layout::

    <root>/<kind>/<name>/v<N>/manifest.json     # JSON manifest; ``files`` maps each file to sha256
    <root>/<kind>/<name>/v<N>/...               # the artifact's files (safetensors, JSON, .pt2)
    <root>/<kind>/<name>/aliases.json           # {"latest": N, "<tag>": N}
    <root>/<kind>/<name>/.lock                  # serialises version allocation and alias updates

An artifact is written completely into a temporary folder under ``<root>/.tmp`` and then renamed
into place while holding the name's lock, so readers never see a half-written version and two
concurrent writers never get the same version number. A temporary folder is named after the
process writing it (``<pid>.<start>~<kind>-<name>-...``, see :mod:`modulelens.repo.owners`);
the next write -- and the start of any tool -- removes the folders of writers that died (a killed
capture), and a process may
install a publish guard (:func:`set_publish_guard`) that is checked just before the rename, so
that a worker whose caller died publishes nothing.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from modulelens.errors import ChecksumMismatch, ModuleLensError, ReferenceNotFound
from modulelens.repo.owners import owner_alive, this_process
from modulelens.repo.refs import Ref, parse_ref, validate_name
from modulelens.repo.trust import SIGNATURE, is_confined, sign_folder

SCHEMA_VERSION = 2
"""The newest manifest schema this version reads. A kind is written with a newer schema only when
its stored form changed in a way an earlier reader would misread (captures: 2, since their export
programs are stored without weights); every other kind is written with :data:`BASE_SCHEMA`."""
BASE_SCHEMA = 1
MANIFEST = "manifest.json"
ALIASES = "aliases.json"
TMP_DIR = ".tmp"
OWNER_SEP = "~"
LEGACY_TMP_MAX_AGE_S = 24 * 3600.0  # temporary folders named before owners were: removed after a day

# Checked just before a new version is renamed into place: a message when it must not be published.
PublishGuard = Callable[[], str | None]
_publish_guard: PublishGuard | None = None


def set_publish_guard(guard: PublishGuard | None) -> None:
    """Install (or remove, with None) this process's publish guard: ``guard()`` returns None when
    publishing may go ahead, otherwise the reason it must not (raised as a ModuleLensError, and the
    temporary folder is removed)."""
    global _publish_guard
    _publish_guard = guard


def remove_stale_tmp(root: Path) -> list[str]:
    """Remove the temporary folders that writers which died left in the repository at ``root`` (see
    :func:`_remove_stale`); nothing when there are none or the repository does not exist."""
    return _remove_stale(Path(root) / TMP_DIR)


def _remove_stale(tmp_root: Path) -> list[str]:
    """Remove the temporary folders under ``tmp_root`` whose writer is no longer running (and
    unnamed ones older than a day). Returns the names removed."""
    import time

    removed = []
    try:
        entries = list(tmp_root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        owner, sep, _ = entry.name.partition(OWNER_SEP)
        if sep:
            stale = not owner_alive(owner)
        else:
            try:
                stale = time.time() - entry.stat().st_mtime > LEGACY_TMP_MAX_AGE_S
            except OSError:
                continue
        if stale:
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return removed


_NO_SPACE = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122", "file write failed")


def _out_of_space(error: BaseException, folder: Path) -> bool:
    """Whether ``error``, raised while writing into ``folder``, is a full disk or quota: said so by its
    message (libraries that write themselves -- safetensors, torch's C++ stream writer -- raise their
    own exception types), or the file system is out of space now."""
    text = str(error).lower()
    if any(marker in text for marker in _NO_SPACE):
        return True
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < (1 << 20)


class ManifestBase(BaseModel):
    """The bookkeeping fields :meth:`Repository.create` adds to every manifest.

    Each domain package owns a subclass with its own fields (``capture.manifest.CaptureManifest``,
    ``ops.model.OpSetManifest``, ...) and reads a stored manifest only through it, with
    :meth:`Artifact.manifest_as`. Unknown fields are kept, so a file written by a newer minor
    version of a domain model still loads. Floats that JSON has no literal for (an argument of
    -inf, a NaN statistic) are written as ``json.dumps`` writes them (-Infinity, NaN), never as
    null, by every serialisation (``model_dump_json`` included).
    """

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")

    schema_version: int = 0
    kind: str = ""
    name: str = ""
    version: int = 0
    ref: str = ""
    created_at: str = ""
    files: dict[str, str] = Field(default_factory=dict, description="relative path -> sha256")


M = TypeVar("M", bound=ManifestBase)


def default_repo_root() -> Path:
    """``--repo`` when given, else ``$MODULELENS_HOME``, else ``./.modulelens``."""
    env = os.environ.get("MODULELENS_HOME")
    return Path(env) if env else Path.cwd() / ".modulelens"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as f:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            import msvcrt

            msvcrt.locking(f.fileno(), msvcrt.LK_LOCK, 1)
            try:
                yield
            finally:
                msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)
            return
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _read_aliases(path: Path) -> dict[str, int]:
    """The tags in an aliases file; {} when it is missing or damaged (not JSON, or not tag ->
    version number), so one bad file cannot break listing or writing the repository."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)}


class Artifact:
    """One stored version. Files are checked against their sha256 when first read."""

    def __init__(self, kind: str, name: str, version: int, path: Path, manifest: dict[str, Any]):
        self.kind = kind
        self.name = name
        self.version = version
        self.path = path
        self.raw_manifest = manifest
        self.base = _validate(ManifestBase, manifest, f"{name}:v{version}")
        self._verified: set[str] = set()
        self._typed: dict[type, ManifestBase] = {}

    def manifest_as(self, model: type[M]) -> M:
        """The manifest read through its domain model (validated once per model, then cached)."""
        if model not in self._typed:
            self._typed[model] = _validate(model, self.raw_manifest, self.ref)
        return self._typed[model]  # type: ignore[return-value]

    @property
    def ref(self) -> str:
        return f"{self.name}:v{self.version}"

    def has_file(self, rel: str) -> bool:
        return rel in self.base.files

    def file(self, rel: str) -> Path:
        """Path of a stored file, after checking it against the manifest's sha256."""
        files = self.base.files
        if rel not in files:
            raise ReferenceNotFound(
                f"{self.kind[:-1]} {self.ref} has no file {rel!r}",
                f"files present: {', '.join(sorted(files)) or 'none'}",
            )
        if not is_confined(self.path, rel):
            raise ChecksumMismatch(f"file {rel!r} of {self.ref} lies outside the artifact",
                                   "the manifest was crafted or damaged; do not trust this artifact")
        path = self.path / rel
        if rel not in self._verified:
            if not path.is_file():
                raise ChecksumMismatch(
                    f"file {rel!r} of {self.ref} is missing from {self.path}",
                    "the artifact was damaged outside modulelens; capture it again",
                )
            actual = sha256_file(path)
            if actual != files[rel]:
                raise ChecksumMismatch(
                    f"file {rel!r} of {self.ref} does not match the sha256 in its manifest "
                    f"(expected {files[rel][:12]}..., found {actual[:12]}...)",
                    "the file was changed after it was written; capture it again, or restore the file",
                )
            self._verified.add(rel)
        return path

    def read_json(self, rel: str) -> Any:
        return json.loads(self.file(rel).read_text())


def validation_problem(error: ValidationError, top: str) -> str:
    """``where: what`` of the first problem pydantic found in a stored record (``top`` names the
    record itself), for one-line errors about damaged files."""
    first = error.errors()[0]
    where = ".".join(str(x) for x in first["loc"]) or top
    return f"{where}: {first['msg']}"


def _validate(model: type[M], data: dict[str, Any], ref: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ChecksumMismatch(
            f"manifest of {ref} does not have the expected form ({validation_problem(e, 'manifest')})",
            "the manifest was edited or damaged outside modulelens; capture it again",
        ) from None


class Repository:
    """A local artifact repository rooted at a directory (created on first write)."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).expanduser().resolve()

    # -- layout -----------------------------------------------------------------------------
    def _name_dir(self, kind: str, name: str) -> Path:
        return self.root / validate_name(kind, "kind") / validate_name(name)

    def names(self, kind: str) -> list[str]:
        d = self.root / kind
        if not d.is_dir():
            return []
        return sorted(p.name for p in d.iterdir() if p.is_dir() and self.versions(kind, p.name))

    def versions(self, kind: str, name: str) -> list[int]:
        d = self._name_dir(kind, name)
        if not d.is_dir():
            return []
        out = []
        for p in d.iterdir():
            if p.is_dir() and p.name[:1] == "v" and p.name[1:].isdigit() and (p / MANIFEST).is_file():
                out.append(int(p.name[1:]))
        return sorted(out)

    def aliases(self, kind: str, name: str) -> dict[str, int]:
        """Tags of ``name`` and ``latest`` (always the newest version). A damaged aliases file loses
        its tags here (a one-line error when a tag is asked for), never the listing."""
        aliases = _read_aliases(self._name_dir(kind, name) / ALIASES)
        versions = self.versions(kind, name)
        if versions:
            aliases["latest"] = versions[-1]
        return aliases

    # -- references -------------------------------------------------------------------------
    def resolve(self, kind: str, ref: str | Ref) -> tuple[str, int]:
        r = parse_ref(ref) if isinstance(ref, str) else ref
        if r.version is not None and (self._name_dir(kind, r.name) / f"v{r.version}" / MANIFEST).is_file():
            return r.name, r.version  # found without listing anything (a confined checker may not list)
        versions = self.versions(kind, r.name)
        what = kind[:-1] if kind.endswith("s") else kind
        if not versions:
            known = self.names(kind)
            import difflib

            close = difflib.get_close_matches(r.name, known, n=3)
            hint = (
                f"did you mean {', '.join(close)}?"
                if close
                else (f"known {kind}: {', '.join(known[:20])}" if known else f"the repository {self.root} has no {kind} yet")
            )
            raise ReferenceNotFound(f"no {what} named {r.name!r} in {self.root}", hint)
        if r.version is not None:
            if r.version not in versions:
                raise ReferenceNotFound(
                    f"{what} {r.name!r} has no version v{r.version}",
                    f"versions: {', '.join(f'v{v}' for v in versions)}",
                )
            return r.name, r.version
        if r.tag is not None:
            aliases = self.aliases(kind, r.name)
            if r.tag not in aliases:
                raise ReferenceNotFound(
                    f"{what} {r.name!r} has no tag {r.tag!r}",
                    f"tags: {', '.join(sorted(aliases))}",
                )
            return r.name, aliases[r.tag]
        return r.name, versions[-1]

    def open(self, kind: str, ref: str | Ref) -> Artifact:
        name, version = self.resolve(kind, ref)
        path = self._name_dir(kind, name) / f"v{version}"
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ChecksumMismatch(
                f"manifest of {name}:v{version} cannot be read ({e})", "capture it again"
            ) from e
        art = Artifact(kind, name, version, path, manifest)
        if art.base.schema_version > SCHEMA_VERSION:
            raise ModuleLensError(
                f"{name}:v{version} was written by a newer modulelens (schema {art.base.schema_version})",
                "upgrade modulelens to read it",
            )
        return art

    # -- writing ----------------------------------------------------------------------------
    def remove_stale_tmp(self) -> list[str]:
        """Remove the temporary folders of writers that died (a killed capture); every write and
        every tool call (:class:`~modulelens.registry.ToolContext`) does this first. Returns the
        folder names removed."""
        return remove_stale_tmp(self.root)

    def create(self, kind: str, name: str, write: Callable[[Path], dict[str, Any] | BaseModel], *,
               signed: bool = True, schema_version: int = BASE_SCHEMA) -> Artifact:
        """Write a new version of ``name``.

        ``write(folder)`` fills an empty temporary folder and returns the manifest fields (a dict,
        or the domain's manifest model, whose bookkeeping fields are then overwritten). The
        version number, checksums and bookkeeping fields are added here; then the folder is
        renamed into place under the name's lock. If ``write`` raises, nothing is left behind.
        ``signed=False`` stores it unsigned, so untrusted until ``trust`` (files pulled from elsewhere).
        ``schema_version`` is the schema the stored form follows (see :data:`SCHEMA_VERSION`).
        """
        name_dir = self._name_dir(kind, name)
        tmp_root = self.root / TMP_DIR
        tmp_root.mkdir(parents=True, exist_ok=True)
        _remove_stale(tmp_root)
        tmp = Path(tempfile.mkdtemp(prefix=f"{this_process()}{OWNER_SEP}{kind}-{name}-", dir=tmp_root))
        try:
            fields = write(tmp)
            if isinstance(fields, BaseModel):
                fields = fields.model_dump(mode="json", exclude=set(ManifestBase.model_fields))
            files = {
                p.relative_to(tmp).as_posix(): sha256_file(p)
                for p in sorted(tmp.rglob("*"))
                if p.is_file() and p.relative_to(tmp).as_posix() not in (MANIFEST, SIGNATURE)
            }
            with _locked(name_dir / ".lock"):
                version = (self.versions(kind, name) or [0])[-1] + 1
                manifest = {
                    **fields,
                    "schema_version": schema_version,
                    "kind": kind,
                    "name": name,
                    "version": version,
                    "ref": f"{name}:v{version}",
                    "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                    "files": files,
                }
                (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
                if signed:
                    sign_folder(tmp, MANIFEST)  # written here, so trusted here (see repo/trust.py)
                refusal = _publish_guard() if _publish_guard is not None else None
                if refusal is not None:
                    raise ModuleLensError(f"{name} was not published: {refusal}", None)
                final = name_dir / f"v{version}"
                os.rename(tmp, final)
                aliases_path = name_dir / ALIASES
                aliases = _read_aliases(aliases_path)
                aliases["latest"] = version
                _write_json_atomic(aliases_path, aliases)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise self.write_failed(e, f"{kind} {name}") from None
        except Exception as e:
            full = _out_of_space(e, tmp_root)  # before the half-written folder frees its space
            shutil.rmtree(tmp, ignore_errors=True)
            if full:  # a library's own error type (safetensors, torch's C++ stream writer)
                raise self.write_failed(OSError(errno.ENOSPC, str(e)), f"{kind} {name}") from None
            raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return Artifact(kind, name, version, final, manifest)

    def write_failed(self, error: OSError, what: str) -> Exception:
        """The error to raise for an OSError while writing ``what`` into this repository: a full
        disk, a quota or a read-only file system become a one-line :class:`ModuleLensError`
        naming the repository and what to do; anything else stays the OSError."""
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            return ModuleLensError(
                f"no space left on the device holding the repository {self.root} while writing {what}",
                f"free space there (remove old versions under {self.root}, or {self.root / '.tmp'} left by killed "
                "runs, or the build cache), or use another --repo")
        if error.errno == errno.EROFS:
            return ModuleLensError(f"cannot write {what} into the repository {self.root}: {error.strerror}",
                                   "use a repository folder you can write to (--repo)")
        return error

    def tag(self, kind: str, ref: str | Ref, tag: str) -> tuple[str, int]:
        """Point ``tag`` at the version ``ref`` resolves to (``latest`` is managed automatically)."""
        validate_name(tag, "tag")
        if tag == "latest":
            raise ModuleLensError("'latest' is set automatically", "choose another tag name")
        name, version = self.resolve(kind, ref)
        name_dir = self._name_dir(kind, name)
        try:
            with _locked(name_dir / ".lock"):
                path = name_dir / ALIASES
                aliases = _read_aliases(path)
                aliases[tag] = version
                _write_json_atomic(path, aliases)
        except OSError as e:
            raise self.write_failed(e, f"tag {tag} of {kind} {name}") from None
        return name, version
