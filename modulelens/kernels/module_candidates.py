"""Module-level candidates: a ``ModelNew`` source that replaces a whole captured module.

The contract (KernelBench's, see :mod:`modulelens.kernels.source`): a Python source defining
``class ModelNew(nn.Module)``, constructed with the captured module's constructor arguments, whose
``forward`` takes the captured inputs and returns what the module returns; the captured weights
are loaded into it by parameter name (so it must name its parameters and buffers as the original
does). It may compile C++ itself (``torch.utils.cpp_extension.load_inline``). A candidate that
sets ``claims_training`` is also checked in training mode and, when the capture has gradients,
against the captured gradients.

Stored as ``candidates/<capture name>.module/vN`` (candidate id ``<capture>.module:vN``) with the
source in ``model_new.py``; validation reports go where card candidates' go
(:func:`modulelens.kernels.candidates.save_report`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from modulelens.errors import ModuleLensError
from modulelens.kernels.candidates import CANDIDATES
from modulelens.repo import Artifact, ManifestBase, Repository

MODULE_BACKEND = "module"
SOURCE_FILE = "model_new.py"


class ModuleCandidate(BaseModel):
    source: str = Field(description="Python source defining the class `class_name`.")
    class_name: str = "ModelNew"
    claims_training: bool = Field(False, description="Claims to be correct in training mode, gradients included.")
    provider: str = "agent"
    provenance: dict[str, Any] = Field(default_factory=dict)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(f"{MODULE_BACKEND}\0{self.class_name}\0{self.source}".encode()).hexdigest()


class ModuleTarget(BaseModel):
    capture: str = Field(description="The capture ref (name:vN) validated against.")
    class_path: str
    module_path: str


class ModuleCandidateManifest(ManifestBase):
    target: ModuleTarget
    backend: str = MODULE_BACKEND
    entry: str = "ModelNew"
    claims_training: bool = False
    provider: str = "agent"
    provenance: dict[str, Any] = Field(default_factory=dict)
    source_file: str = SOURCE_FILE
    source_sha256: str = ""


def module_candidate_name(capture: Artifact) -> str:
    return f"{capture.name}.module"


def save_module_candidate(repo: Repository, target: ModuleTarget, capture: Artifact, cand: ModuleCandidate) -> Artifact:
    def write(folder: Path) -> ModuleCandidateManifest:
        (folder / SOURCE_FILE).write_text(cand.source)
        return ModuleCandidateManifest(target=target, entry=cand.class_name, claims_training=cand.claims_training,
                                       provider=cand.provider, provenance=cand.provenance,
                                       source_sha256=cand.sha256)

    return repo.create(CANDIDATES, module_candidate_name(capture), write)


def is_module_candidate(art: Artifact) -> bool:
    return art.base.model_extra is not None and art.base.model_extra.get("backend") == MODULE_BACKEND


def load_module_candidate(repo: Repository, candidate_id: str) -> tuple[Artifact, ModuleCandidate, ModuleTarget]:
    art = repo.open(CANDIDATES, candidate_id)
    if not is_module_candidate(art):
        raise ModuleLensError(f"{art.ref} is not a module-level candidate", "give a <capture>.module:vN candidate id")
    m = art.manifest_as(ModuleCandidateManifest)
    cand = ModuleCandidate(source=art.file(m.source_file).read_text(), class_name=m.entry,
                           claims_training=m.claims_training, provider=m.provider, provenance=m.provenance)
    return art, cand, m.target


def load_class(source: str, class_name: str = "ModelNew") -> type:
    """Execute a module candidate's source as a fresh module and return its ``class_name``.
    The module is registered in ``sys.modules`` under a name derived from the source's hash (so
    its classes can be found by name) and executed once per process."""
    import sys
    import types

    import torch

    name = "modulelens_module_" + hashlib.sha256(source.encode()).hexdigest()[:16]
    mod = sys.modules.get(name)
    if mod is None:
        mod = types.ModuleType(name)
        mod.__file__ = f"<module candidate {name}>"
        exec(compile(source, mod.__file__, "exec"), mod.__dict__)
        sys.modules[name] = mod
    cls = getattr(mod, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise ModuleLensError(f"the source defines no nn.Module subclass named {class_name}",
                              "define `class ModelNew(nn.Module)` at the top level")
    return cls


def construct(cls: type, args_spec: Any, kwargs_spec: Any, tensors: dict[str, Any], sys_path: list[str]) -> Any:
    """``cls(*args, **kwargs)`` with the captured constructor arguments: ``args_spec`` a list and
    ``kwargs_spec`` a dict of value specs (a capture's ``init`` module spec holds them), decoded by
    :mod:`modulelens.capture.values`; ``tensors`` holds the tensors they refer to."""
    from modulelens.capture import Decoder, Resolver, TensorSource

    resolver = Resolver(sys_path=sys_path)
    decoder = Decoder(TensorSource(tensors), resolver, lambda spec: construct(
        resolver(spec["cls"]), spec["args"], spec["kwargs"], tensors, sys_path))
    args = [decoder.decode(a) for a in args_spec or []]
    kwargs = {k: decoder.decode(v) for k, v in (kwargs_spec or {}).items()}
    return cls(*args, **kwargs)
