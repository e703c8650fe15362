"""The kernel pack file: validated candidates keyed by the call pattern they were validated for
(and, where their kernel declared one and validation checked it, the shape rule it admits calls by).

One JSON file (never pickle)::

    {"format": "modulelens-pack", "format_version": 1, "sha256": "<hex>", "content": {...}}

``sha256`` is taken over the canonical JSON of ``content`` (sorted keys, no spaces): change any
byte of a source, a pattern, a report or the environment and the pack no longer loads. Pass the
sha256 you were given (``expect_sha256``) to refuse a pack rewritten as a whole.

``content`` is a :class:`PackContent`: the environment the entries were validated in (torch
version, device name, compiler) and the entries (:class:`PackEntry`): the call pattern, the
phase, the checked shape rule, the source with its build recipe, the validation report and the
measured speedup. Packs written before shape rules and phases load as exact-shape forward entries. A pack refuses to
load where the environment differs, saying what differs, unless ``allow_env_mismatch`` is set.

A pack carries code that is compiled and run, so it loads only when **trusted** here (see
:mod:`modulelens.repo.trust`): :func:`write_pack` signs the file's sha256 with this machine's key in
``FILE.sig`` next to it; a pack stored in the repository (``packs/NAME/vN/pack.json``, how a
pulled pack arrives) is trusted when its version is (``modulelens trust NAME:vN --kind packs --yes``)
and the file still has the sha256 its manifest lists. A pack copied from elsewhere is refused.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import hmac
import json
import platform
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from modulelens.dispatch.patterns import CallPattern
from modulelens.errors import ModuleLensError, tool_call
from modulelens.kernels import ShapeRule
from modulelens.paths import write_text
from modulelens.repo import MANIFEST, UntrustedArtifact, is_trusted, sha256_file, signature_of
from modulelens.timing import surely_above_one
from modulelens.validation import ExtensionBuild, ValidationReport

PACK_FORMAT = "modulelens-pack"
PACK_FORMAT_VERSION = 1
EntryKind = Literal["op", "module"]
STORED_PACK_FILE = "pack.json"  # the pack file inside a repository version of kind packs
SIGNATURE_SUFFIX = ".sig"


class PackLoadError(ModuleLensError):
    """A pack that must not be loaded: tampered, malformed, or from another environment."""


class PackEnvironment(BaseModel):
    torch: str = Field(description="torch version the entries were validated with.")
    python: str = ""
    device_name: str = Field(description="CPU model (and -march fingerprint) or GPU name.")
    compiler: str = Field("", description="C++ compiler of cpp entries (empty when no entry is compiled).")
    machine: str = ""


class ModuleInit(BaseModel):
    """How a module entry's ``ModelNew`` is constructed: the captured constructor arguments, as
    value specs of :mod:`modulelens.capture.values` (tensors inline, base64 safetensors)."""

    args: Any = None
    kwargs: Any = None
    tensors_b64: str = ""
    sys_path: list[str] = Field(default_factory=list)


class PackEntry(BaseModel):
    candidate_id: str
    kind: EntryKind = Field(description="op: replaces one aten operator call; module: replaces a module's forward.")
    target: str = Field(description="The card id (op) or the capture ref (module) it was validated against.")
    capture: str | None = Field(None, description="The capture the target came from (check-pack replays it).")
    op: str | None = Field(None, description="aten overload, for op entries (aten._safe_softmax.default).")
    class_path: str | None = Field(None, description="module:Class of the replaced module, for module entries.")
    module_path: str | None = Field(None, description="Qualified name of the replaced module in its model (blocks.1).")
    pattern: CallPattern
    phase: Literal["forward", "backward"] = Field("forward", description="Op entries: the phase its card was "
                                                  "recorded in (backward: called by the autograd engine).")
    shape_rule: ShapeRule | None = Field(None, description="The checked shape rule calls are admitted by (None: "
                                         "the pattern's exact shapes).")
    backend: str = Field(description="cpp, cuda, triton (op entries) or module (a ModelNew Python source).")
    entry: str = Field("forward", description="Entry point: forward for op kernels, ModelNew for modules.")
    source: str
    source_sha256: str
    build: dict[str, Any] = Field(default_factory=dict, description="Build recipe: compiler, flags, builder.")
    init: ModuleInit | None = None
    builds: list[ExtensionBuild] = Field(default_factory=list, description="Module entries: the builds of its "
                                         "load_inline extensions that validation verified (content address and "
                                         "checksum in the build cache); loaded from there, never compiled silently.")
    claims_training: bool = Field(False, description="Module entries: validated for training (gradients).")
    report: ValidationReport
    speedup_vs_eager: float | None = None
    speedup_interval: list[float] | None = Field(None, description="95% interval of the speedup at validation.")
    forced: bool = Field(False, description="Packed with --force: used whatever its speedup interval says.")

    def skip_reason(self) -> str | None:
        """Why this entry is never dispatched, or None when it is: it must be validated correct
        and surely faster than eager, the lower bound of its speedup's 95% interval above 1
        (unless packed with ``force``)."""
        if not self.report.correct or self.report.verdict == "rejected":
            return f"not validated correct ({self.report.verdict}: {self.report.reason})"
        if self.forced:
            return None
        interval = self.speedup_interval or self.report.speedup_interval
        if not interval:
            why = self.report.timing_reason or "no speedup interval in its report (validated before intervals, or not timed)"
            return f"not timed against eager with an interval: {why}; validate it again, or pack it with force"
        if not surely_above_one(interval):
            low, high = interval
            return (f"not surely faster than eager: its speedup's 95% interval is {low:.2f}x..{high:.2f}x "
                    "(the lower bound must be above 1; pack it with force to use it anyway)")
        return None


class PackContent(BaseModel):
    created_at: str = Field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    environment: PackEnvironment
    entries: list[PackEntry]


class LoadedPackFile(BaseModel):
    path: str
    sha256: str
    content: PackContent
    environment_notes: list[str] = Field(default_factory=list, description="Mismatches allowed by allow_env_mismatch.")


@cache
def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def current_environment(backends: set[str]) -> PackEnvironment:
    """This process's environment, as a pack with entries of ``backends`` records it."""
    import sys

    import torch

    from modulelens.kernels import compiler_version, machine_tag

    if backends & {"cuda", "triton"} and torch.cuda.is_available():
        device = torch.cuda.get_device_name()
    else:
        device = f"{_cpu_name()} [{machine_tag()}]"
    compiler = ""
    if backends & {"cpp", "module"}:
        import os

        compiler = compiler_version(os.environ.get("CXX", "c++"))
    if "cuda" in backends:
        compiler = (compiler + "; " if compiler else "") + compiler_version("nvcc")
    return PackEnvironment(torch=torch.__version__, python=sys.version.split()[0], device_name=device,
                           compiler=compiler, machine=platform.machine())


def environment_mismatches(recorded: PackEnvironment, here: PackEnvironment) -> list[str]:
    out = []
    if recorded.torch != here.torch:
        out.append(f"the pack was validated with torch {recorded.torch}, this is torch {here.torch}")
    if recorded.device_name != here.device_name:
        out.append(f"the pack was validated on {recorded.device_name!r}, this is {here.device_name!r}")
    if recorded.compiler and recorded.compiler != here.compiler:
        out.append(f"the pack was built with {recorded.compiler!r}, this machine has {here.compiler!r}")
    return out


def _canonical(content: Any) -> bytes:
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def write_pack(path: Path, content: PackContent) -> str:
    """Write ``content`` to ``path``; returns its sha256."""
    data = content.model_dump(mode="json")
    digest = hashlib.sha256(_canonical(data)).hexdigest()
    write_text(path, json.dumps({"format": PACK_FORMAT, "format_version": PACK_FORMAT_VERSION, "sha256": digest,
                                 "content": data}, indent=1))  # atomic; no temporary file left on failure
    sign_pack_file(path, digest)  # written here, so trusted here
    return digest


def _signature_path(path: Path) -> Path:
    return path.with_name(path.name + SIGNATURE_SUFFIX)


def sign_pack_file(path: Path, sha256: str) -> None:
    """Sign the pack file ``path`` of content ``sha256`` with this machine's key (``FILE.sig``: HMAC
    over that sha256, which covers every byte of the content)."""
    write_text(_signature_path(path), signature_of(sha256.encode()))


def stored_version(path: Path) -> Path | None:
    """The repository version folder holding the pack file ``path``, or None for a file elsewhere."""
    return path.parent if path.name == STORED_PACK_FILE and (path.parent / MANIFEST).is_file() else None


def pack_is_trusted(path: Path, sha256: str) -> bool:
    """Whether the pack file ``path``, whose content has (verified) ``sha256``, may be loaded here
    (see the module docstring)."""
    version = stored_version(path)
    if version is not None:
        try:
            listed = json.loads((version / MANIFEST).read_text()).get("files", {}).get(STORED_PACK_FILE)
        except (OSError, ValueError, AttributeError):
            return False
        return is_trusted(version) and listed == sha256_file(path)
    try:
        stored = _signature_path(path).read_text().strip()
    except OSError:
        return False
    return hmac.compare_digest(stored, signature_of(sha256.encode()))


def require_trusted_pack(path: Path, sha256: str) -> None:
    """Raise :class:`UntrustedArtifact` unless the pack file ``path`` is trusted here."""
    if pack_is_trusted(path, sha256):
        return
    version = stored_version(path)
    if version is not None:
        ref, root = f"{version.parent.name}:{version.name}", version.parent.parent.parent
        hint = (f"review it with {tool_call('trust', ref=ref, kind='packs')}, then trust it with "
                f"{tool_call('trust', ref=ref, kind='packs', yes=True)} (in the repository {root})")
    else:
        hint = (f"build the pack here with {tool_call('pack')}, or get it with {tool_call('pull')} and trust it "
                f"with {tool_call('trust', ref='NAME', kind='packs', yes=True)}")
    raise UntrustedArtifact(f"{path} is not trusted here (not written on this machine, or changed since), so modulelens "
                            "will not load it: a pack's kernels are compiled and run", hint)


def verify_pack_file(path: str | Path, *, expect_sha256: str | None = None) -> tuple[Path, str, PackContent]:
    """Read a pack file and check it is one, untampered (and of sha256 ``expect_sha256`` when
    given): (path, sha256, content), or :class:`PackLoadError` saying why not. Trust and the
    environment are not checked (:func:`read_pack` does): this is what a push may send."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise PackLoadError(f"pack file {str(path)!r} does not exist", f"create one with {tool_call('pack')}")
    try:
        raw = json.loads(p.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PackLoadError(f"{p} is not a modulelens pack (not JSON: {e})", f"give a file written by {tool_call('pack')}") from None
    if not isinstance(raw, dict) or raw.get("format") != PACK_FORMAT or not isinstance(raw.get("content"), dict):
        raise PackLoadError(f"{p} is not a modulelens pack", f"give a file written by {tool_call('pack')}")
    if raw.get("format_version") != PACK_FORMAT_VERSION:
        raise PackLoadError(f"{p} has pack format version {raw.get('format_version')}, this modulelens reads "
                            f"version {PACK_FORMAT_VERSION}", "rebuild the pack with this version")
    digest = hashlib.sha256(_canonical(raw["content"])).hexdigest()
    if digest != raw.get("sha256"):
        raise PackLoadError(f"{p} was modified after it was written: its content does not match its sha256",
                            f"a tampered pack is never loaded; rebuild it with {tool_call('pack')}")
    if expect_sha256 and digest != expect_sha256.lower():
        raise PackLoadError(f"{p} has sha256 {digest}, not the expected {expect_sha256}",
                            "use the pack whose sha256 you were given")
    try:
        content = PackContent.model_validate(raw["content"])
    except ValidationError as e:
        raise PackLoadError(f"{p} has a malformed entry: {str(e).splitlines()[0]}", "rebuild the pack") from None
    return p, digest, content


def read_pack(path: str | Path, *, allow_env_mismatch: bool = False, expect_sha256: str | None = None) -> LoadedPackFile:
    """Read and verify a pack file for loading. Raises :class:`PackLoadError` saying why it cannot be
    loaded: not a pack, tampered (checksum), another sha256 than expected, or another environment
    (unless ``allow_env_mismatch``: then the differences are in ``environment_notes``); and
    :class:`~modulelens.repo.trust.UntrustedArtifact` when it is not trusted here."""
    p, digest, content = verify_pack_file(path, expect_sha256=expect_sha256)
    require_trusted_pack(p, digest)
    here = current_environment({e.backend for e in content.entries})
    mismatches = environment_mismatches(content.environment, here)
    if mismatches and not allow_env_mismatch:
        raise PackLoadError(f"refusing to load {p}: " + "; ".join(mismatches),
                            "validate and pack the kernels again here, or pass allow_env_mismatch=True "
                            "(--allow-env-mismatch) to load it anyway")
    return LoadedPackFile(path=str(p.resolve()), sha256=digest, content=content, environment_notes=mismatches)
