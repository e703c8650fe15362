"""The artifact repository (ModuleRepo): named, immutably versioned, checksummed artifacts."""

from modulelens.repo.refs import Ref, parse_ref, validate_name
from modulelens.repo.store import Artifact, Repository

__all__ = ["Artifact", "Ref", "Repository", "parse_ref", "validate_name"]
