"""The artifact repository (ModuleRepo): named, immutably versioned, checksummed artifacts.

Other packages import only the names below, from ``modulelens.repo``: the store and its refs,
the owner records of running processes, and the trust of artifacts that could run code.
"""

from modulelens.repo.owners import owner_alive, this_process
from modulelens.repo.refs import Ref, parse_ref, validate_name
from modulelens.repo.store import (
    MANIFEST,
    Artifact,
    ManifestBase,
    Repository,
    default_repo_root,
    remove_stale_tmp,
    set_publish_guard,
    sha256_file,
    validation_problem,
)
from modulelens.repo.trust import (
    KEY_FILE,
    TrustReview,
    UntrustedArtifact,
    accept_verified,
    config_dir,
    forbid_key,
    is_confined,
    is_trusted,
    require_trusted,
    sign_folder,
    signature_of,
    verified_digest,
)
from modulelens.repo.trust import review as review_trust
from modulelens.repo.trust import trust as trust_artifact

__all__ = ["MANIFEST", "Artifact", "ManifestBase", "Ref", "Repository", "default_repo_root", "parse_ref",
           "remove_stale_tmp", "set_publish_guard", "sha256_file", "validate_name", "validation_problem",
           "owner_alive", "this_process",
           "KEY_FILE", "TrustReview", "UntrustedArtifact", "accept_verified", "config_dir", "forbid_key",
           "is_confined", "is_trusted", "require_trusted", "review_trust", "sign_folder", "signature_of",
           "trust_artifact", "verified_digest"]
