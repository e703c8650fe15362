"""Module entries load the extensions validation verified, not a fresh compile in the user's run.

A module entry's ``ModelNew`` source calls ``torch.utils.cpp_extension.load_inline`` when it is
executed. Where a pack is loaded, :func:`verified_load_inline` is in force while the source runs:
each ``load_inline(name=...)`` is answered from

1. the **verified build**: the build cache's published build at the address the entry records
   (:attr:`PackEntry.builds`, the address validation computed from the source, the name and the
   toolchain), loaded only when that address is also the one this toolchain gives and the file's
   sha256 is the recorded one; else
2. a build **made for packs** before the script started (:func:`prepare_builds`, run by ``run`` and
   ``check-pack``: in a separate process, with progress, into ``<build cache>/packs/<address>``,
   never the user's torch extensions folder); else
3. a build in this process, into that same folder, said so in the entry's report (``builds``).

What each extension was loaded from is kept per entry (:func:`build_notes`), for the dispatch report.
"""

from __future__ import annotations

import contextlib
import inspect
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from modulelens.dispatch.pack import PackContent, PackEntry

PACK_BUILDS = "packs"


def _address(entry: PackEntry, name: str) -> str:
    from modulelens.kernels import module_build_address

    return module_build_address(entry.source, name)


def verified_library(entry: PackEntry, name: str, build_dir: Path) -> Path | None:
    """The verified build of extension ``name`` of ``entry`` in the build cache, when the
    toolchain here gives the recorded address and the file's checksum is the recorded one."""
    from modulelens.kernels import LIB_SUFFIX, published_build

    recorded = next((b for b in entry.builds if b.name == name), None)
    if recorded is None or recorded.address != _address(entry, name):
        return None
    found = published_build(recorded.address, f"{name}{LIB_SUFFIX}", shared=build_dir)
    if found is None:
        return None
    import hashlib

    return found if hashlib.sha256(found.read_bytes()).hexdigest() == recorded.sha256 else None


def pack_build_folder(entry: PackEntry, name: str, build_dir: Path) -> Path:
    """Where extension ``name`` of ``entry`` is built for packs when no verified build is here."""
    return Path(build_dir) / PACK_BUILDS / _address(entry, name)


_NOTES: dict[str, list[str]] = {}


def build_notes(candidate_id: str) -> list[str]:
    """What each extension of the entry ``candidate_id`` was loaded from in this process."""
    return list(_NOTES.get(candidate_id, []))


@contextlib.contextmanager
def verified_load_inline(entry: PackEntry, build_dir: Path | None = None,
                         say: Callable[[str], None] | None = None) -> Iterator[None]:
    """While the block runs (the entry's source executing), answer ``load_inline`` as the module
    docstring says. ``say``: where to tell that an extension is compiled here (stderr by default)."""
    import torch.utils.cpp_extension as ext

    from modulelens.kernels import LIB_SUFFIX, default_build_dir, import_library

    root = Path(build_dir) if build_dir is not None else default_build_dir()
    original = ext.load_inline
    signature = inspect.signature(original)
    notes = _NOTES.setdefault(entry.candidate_id, [])
    tell = say or (lambda msg: print(f"modulelens: {msg}", file=sys.stderr, flush=True))

    def load_inline(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        name = bound.arguments.get("name")
        if not isinstance(name, str) or not name.isidentifier() or not bound.arguments.get("is_python_module", True):
            return original(*args, **kwargs)
        verified = verified_library(entry, name, root)
        if verified is not None:
            notes.append(f"{name}: the verified build {verified.parent.name}")
            return import_library(name, verified)
        folder = pack_build_folder(entry, name, root)
        built = folder / f"{name}{LIB_SUFFIX}"
        if built.is_file() and (folder / "done").is_file():
            notes.append(f"{name}: built for packs before the run ({folder})")
            return import_library(name, built)
        why = _missing(entry, name)
        tell(f"compiling extension {name} of {entry.candidate_id} in this process into {folder} ({why})")
        folder.mkdir(parents=True, exist_ok=True)
        bound.arguments["build_directory"] = str(folder)
        module = original(*bound.args, **bound.kwargs)
        (folder / "done").write_text("built\n")
        notes.append(f"{name}: compiled in this process ({why}) into {folder}")
        return module

    ext.load_inline = load_inline
    try:
        yield
    finally:
        ext.load_inline = original


def _missing(entry: PackEntry, name: str) -> str:
    recorded = next((b for b in entry.builds if b.name == name), None)
    if recorded is None:
        return "the pack records no verified build of it"
    if recorded.address != _address(entry, name):
        return "its verified build was made with another toolchain"
    return f"its verified build {recorded.address} is not in this build cache"


def missing_builds(content: PackContent, build_dir: Path) -> list[tuple[int, str]]:
    """(entry index, extension name) of the recorded extensions of module entries that have neither
    a verified build nor a build made for packs here."""
    from modulelens.kernels import LIB_SUFFIX

    out = []
    for i, entry in enumerate(content.entries):
        if entry.kind != "module" or entry.skip_reason() is not None:
            continue
        for b in entry.builds:
            folder = pack_build_folder(entry, b.name, build_dir)
            if verified_library(entry, b.name, build_dir) is None and not (
                    (folder / f"{b.name}{LIB_SUFFIX}").is_file() and (folder / "done").is_file()):
                out.append((i, b.name))
    return out


def prepare_builds(pack_path: str | Path, progress: Callable[[str], None], build_dir: Path | None = None,
                   timeout: float = 3600) -> list[str]:
    """Before a script runs with the pack at ``pack_path``: build every missing extension of its
    module entries (:func:`missing_builds`) in a separate process (``python -m
    modulelens.dispatch.builds PACK INDEX``), into the build cache's ``packs`` folder, saying so
    through ``progress``. Returns what was built. A build that fails raises, naming the entry."""
    from modulelens.dispatch.pack import read_pack
    from modulelens.errors import ModuleLensError
    from modulelens.kernels import default_build_dir

    root = Path(build_dir) if build_dir is not None else default_build_dir()
    content = read_pack(pack_path, allow_env_mismatch=True).content
    todo = missing_builds(content, root)
    done = []
    for index in dict.fromkeys(i for i, _ in todo):
        entry = content.entries[index]
        names = [n for i, n in todo if i == index]
        progress(f"building {', '.join(names)} of {entry.candidate_id} before the script starts "
                 f"(no verified build in {root})")
        r = subprocess.run([sys.executable, "-m", "modulelens.dispatch.builds", str(pack_path), str(index), str(root)],
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise ModuleLensError(f"the extensions of {entry.candidate_id} could not be built: "
                                  f"{(r.stderr or r.stdout).strip()[-600:]}",
                                  "validate the candidate again on this machine, or drop it from the pack")
        done += [f"{entry.candidate_id}: {n}" for n in names]
    return done


def _build_entry(pack_path: str, index: int, build_dir: str) -> None:
    """(A separate process) execute entry ``index``'s source with :func:`verified_load_inline`,
    which builds its missing extensions into the packs folder."""
    from modulelens.dispatch.pack import read_pack
    from modulelens.kernels import load_class

    entry = read_pack(pack_path, allow_env_mismatch=True).content.entries[index]
    with verified_load_inline(entry, Path(build_dir), say=lambda msg: print(msg, flush=True)):
        load_class(entry.source, entry.entry)


if __name__ == "__main__":
    _build_entry(sys.argv[1], int(sys.argv[2]), sys.argv[3])
