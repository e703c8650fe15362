"""The artifact repository (ModuleRepo): named, immutably versioned, checksummed artifacts."""

from modulelens.repo.refs import Ref, parse_ref, validate_name
from modulelens.repo.store import Artifact, ManifestBase, Repository, default_repo_root

__all__ = ["Artifact", "ManifestBase", "Ref", "Repository", "default_repo_root", "parse_ref", "validate_name"]
