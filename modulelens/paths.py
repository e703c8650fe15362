"""Paths a request names: where a tool may write (an output path) and what it may read as a source.

**Relative paths** are resolved against the *project folder* of the call
(:attr:`~modulelens.registry.ToolContext.project`): in the CLI the shell's working directory, as
people expect; over MCP, in background jobs and in the UI the folder that holds the repository
(``<project>/.modulelens`` by default, so ``out="k.pack"`` is ``<project>/k.pack``), never the
server's own working directory. An absolute path (or ``~``) is taken as given.

**Outputs** (:func:`output_file`, :func:`output_folder`): a non-empty path, not under ``/proc``,
``/sys`` or ``/dev`` (after symlinks are followed), that is a regular file or folder or does not
exist yet; anything else is refused with one line before anything is written. :func:`write_text`
writes a file atomically (a temporary file next to it, then a rename) and removes the temporary
file on any failure, and an ``OSError`` becomes a one-line error naming the path and the cause.

An output outside the project folder and the repository is refused where paths come from an
agent (MCP calls, their jobs, the UI) unless the request passes ``allow_outside``
(:func:`refuse_outside_outputs`, run by those front ends before the tool), and only warned about
where a person typed it (the CLI, :func:`outside_output_warnings`): an agent's ``out="/"`` or
``"../x"`` must not write beside the project without a word.

**Inputs** (:func:`input_path`): a file or folder a tool reads (a training script, a pack file),
resolved by the same rule; it must exist and be of the kind asked for (a regular file, or a
folder), else one line names the argument, the path as resolved and the fix. It may lie outside
the project (scripts and packs often do); the reply names the resolved path.

**Sources** (:func:`source_file`): resolved with symlinks followed; the file they lead to must be a
regular file inside the project folder or the repository, unless the caller passes
``allow_outside`` (a symlink named ``k.cpp`` cannot smuggle ``/etc/shadow`` in). What it reads is
:func:`~modulelens.kernels.source.read_source_file`'s to decide.

A leaf module: only :mod:`modulelens.errors`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from modulelens.errors import ModuleLensError, arg

__all__ = ["OUTPUT_FIELDS", "SYSTEM_FOLDERS", "input_path", "input_script", "is_inside", "output_file", "output_folder",
           "outside_output_warnings", "outside_warnings", "project_folder", "refuse_outside_outputs", "resolve",
           "source_file", "write_text"]

OUTPUT_FIELDS = ("out",)
"""Request fields that name a path a tool writes (a file or a folder), in every tool that has one."""

SYSTEM_FOLDERS = (Path("/proc"), Path("/sys"), Path("/dev"))
"""Folders no output may be under (pseudo-filesystems and devices, whatever a symlink says)."""


def project_folder(repo_root: Path) -> Path:
    """The project a repository belongs to: the folder that holds it (absolute)."""
    return Path(repo_root).expanduser().absolute().parent


def resolve(given: str, base: Path) -> Path:
    """``given`` as an absolute path, relative ones taken from ``base``, ``~`` expanded, every
    symlink that exists followed (a loop is a :class:`ModuleLensError`)."""
    path = Path(given).expanduser()
    try:
        return (path if path.is_absolute() else Path(base) / path).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop, a path too long
        raise ModuleLensError(f"cannot follow the path {given!r}: {exc}", "give a plain path") from None


def _checked_output(given: str, base: Path, field: str) -> Path:
    if not given or not given.strip():
        raise ModuleLensError(f"{arg(field)} is empty: it must name a file or folder to write",
                              f"give a path, e.g. {arg(field, 'out/name')}")
    if "\x00" in given:
        raise ModuleLensError(f"{arg(field)} holds a NUL character", "give a plain path")
    path = resolve(given, base)
    for system in SYSTEM_FOLDERS:
        if path == system or path.is_relative_to(system):
            raise ModuleLensError(f"{arg(field)} {given!r} is under {system}, a system folder: nothing is written there",
                                  f"give {arg(field)} a path in your project or another folder of yours")
    return path


def output_file(given: str, base: Path, field: str = "out") -> Path:
    """The file ``given`` (request field ``field``) names, to be created or replaced: refused
    when empty, under a system folder, an existing folder or any other non-regular file (a
    device, a pipe, a socket), or when its parent exists and is not a folder."""
    path = _checked_output(given, base, field)
    if path.is_dir():
        raise ModuleLensError(f"{arg(field)} {given!r} is a folder, not a file",
                              f"name the file to write inside it, e.g. {arg(field, str(Path(given) / 'name'))}")
    if path.exists() and not path.is_file():
        raise ModuleLensError(f"{arg(field)} {given!r} exists and is not a regular file (a device, pipe or socket)",
                              "give the path of a file to create or replace")
    _parent_is_folder(path, given, field)
    return path


def output_folder(given: str, base: Path, field: str = "out") -> Path:
    """The folder ``given`` (request field ``field``) names, to be written into (created when
    missing): refused when empty, under a system folder, or when it exists and is not a folder."""
    path = _checked_output(given, base, field)
    if path.exists() and not path.is_dir():
        raise ModuleLensError(f"{arg(field)} {given!r} exists and is not a folder", "give a folder to write into")
    _parent_is_folder(path, given, field)
    return path


def _parent_is_folder(path: Path, given: str, field: str) -> None:
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ModuleLensError(f"{arg(field)} {given!r} goes through {parent}, which is a file",
                                      "give a path whose folders are folders")
            return


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file in the same folder, renamed over it);
    the parent folders are created. On any failure the temporary file is removed and an
    ``OSError`` becomes a :class:`ModuleLensError` naming ``path`` and the cause."""
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        blocker = _file_in_the_way(path)
        cause = f"{blocker} is a file, not a folder" if blocker else (exc.strerror or str(exc))
        raise ModuleLensError(f"cannot write {path}: {cause}",
                              "give a path in a folder you can write to") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _file_in_the_way(path: Path) -> Path | None:
    """The nearest ancestor of ``path`` that exists as something other than a folder, if any."""
    for parent in reversed(path.parents):
        if parent.exists() and not parent.is_dir():
            return parent
    return None


def input_path(given: str, base: Path, field: str, folder: bool = False) -> Path:
    """The existing regular file (with ``folder``: the folder) that ``given`` (request field
    ``field``) names, resolved against ``base`` (the project folder of the call) with symlinks
    followed. Anything else is refused with one line naming ``field``, the resolved path and the fix."""
    what = "folder" if folder else "file"
    where = f"an absolute path, or one relative to the project folder {Path(base).absolute()}"
    if not given or not given.strip() or "\x00" in given:
        raise ModuleLensError(f"{field} is empty or not a plain path: it must name a {what} to read",
                              f"give {where}")
    path = resolve(given, base)
    if not path.exists():
        raise ModuleLensError(f"{field} {given!r} not found: {path} does not exist", f"give {where}")
    if folder and not path.is_dir():
        raise ModuleLensError(f"{field} {given!r} is not a folder: {path}", f"give the folder to read ({where})")
    if not folder and not path.is_file():
        kind = "a folder, not a file" if path.is_dir() else "not a regular file (a device, pipe or socket)"
        raise ModuleLensError(f"{field} {given!r} is {kind}: {path}", f"give the file to read ({where})")
    return path


def input_script(given: str, base: Path, field: str = "script") -> Path:
    """The Python file ``given`` names (see :func:`input_path`), checked to be Python before it
    runs: a file that is not (a pack, a binary, a text) is refused with one line naming the file
    and the line where it stops being Python, not a line of modulelens's."""
    path = input_path(given, base, field)
    try:
        compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"{path}:{exc.lineno}" if exc.lineno else str(path)
        raise ModuleLensError(f"{field} {given!r} is not a Python file: {where}: {exc.msg}",
                              "give the Python script to run (a training script or a KernelBench file)") from None
    except (ValueError, OSError) as exc:  # NUL bytes, unreadable
        raise ModuleLensError(f"{field} {given!r} is not a Python file: {path}: {exc}",
                              "give the Python script to run (a training script or a KernelBench file)") from None
    return path


def source_file(given: str, base: Path, repo_root: Path, allow_outside: bool = False,
                field: str = "source") -> Path:
    """The regular file that ``given`` (request field ``field``) leads to, symlinks followed.
    Outside ``base`` (the project folder) and ``repo_root`` only with ``allow_outside``; the
    refusal says neither where a symlink leads nor whether the file there exists."""
    if not given or not given.strip() or "\x00" in given:
        raise ModuleLensError(f"{arg(field)} is empty", "give the path of your source file")
    path = resolve(given, base)
    if not allow_outside and not is_inside(path, base, repo_root):  # first: nothing said of files outside
        raise ModuleLensError(f"source file {given!r} is outside the project folder {Path(base).resolve()} and the "
                              "repository (symlinks followed)",
                              f"copy it into the project, or pass {arg('allow_outside')} if you mean to read it")
    if not path.is_file():
        what = "does not exist" if not path.exists() else "is not a regular file"
        raise ModuleLensError(f"source file {given!r} {what}", "give the path of your source file")
    return path


def is_inside(path: Path, base: Path, repo_root: Path) -> bool:
    """Whether ``path`` (resolved) is inside the project folder ``base`` or the repository."""
    return any(path.is_relative_to(Path(folder).expanduser().resolve()) for folder in (base, repo_root))


def outside_warnings(path: Path | None, base: Path, repo_root: Path) -> list[str]:
    """The warning a reply carries when its source was read from outside the project (with
    ``allow_outside``, or typed by a person): where it was read from."""
    if path is None or is_inside(path, base, repo_root):
        return []
    return [f"the source was read from {path}, outside the project (where paths come from an agent, only with "
            f"{arg('allow_outside')})"]


def _outside_outputs(values: Mapping[str, Any], base: Path, repo_root: Path) -> list[tuple[str, str, Path]]:
    """(field, path as given, resolved) of each output of a request (its :data:`OUTPUT_FIELDS`)
    outside the project folder ``base`` and the repository; a path that cannot be resolved, or
    lies under a system folder, is left to the tool's own checks."""
    out = []
    for field in OUTPUT_FIELDS:
        given = values.get(field)
        if not isinstance(given, str) or not given.strip() or "\x00" in given:
            continue
        try:
            path = resolve(given, base)
        except ModuleLensError:
            continue
        if any(path == system or path.is_relative_to(system) for system in SYSTEM_FOLDERS):
            continue  # the tool's own check says so (a system folder)
        if not is_inside(path, base, repo_root):
            out.append((field, given, path))
    return out


def refuse_outside_outputs(values: Mapping[str, Any], base: Path, repo_root: Path) -> None:
    """Refuse a request (its field values, defaults included) from an agent whose output lies
    outside the project folder ``base`` and the repository, unless it passes ``allow_outside`` (a
    tool without that field writes only inside); before anything runs."""
    if values.get("allow_outside"):
        return
    for field, given, path in _outside_outputs(values, base, repo_root):
        allow = f", or pass {arg('allow_outside')} if you mean to write there" if "allow_outside" in values else ""
        raise ModuleLensError(f"{arg(field)} {given!r} is {path}, outside the project folder {Path(base).resolve()} "
                              "and the repository: nothing is written there",
                              f"give a path inside the project (relative paths are taken from it){allow}")


def outside_output_warnings(values: Mapping[str, Any], base: Path, repo_root: Path) -> list[str]:
    """What a reply says of a request's outputs a person typed outside the project (written there)."""
    return [f"{arg(field)} {given!r} was written at {path}, outside the project folder {Path(base).resolve()}"
            for field, given, path in _outside_outputs(values, base, repo_root)]
