"""Errors that reach users: each says what is wrong and how to fix it."""

from __future__ import annotations


class ModuleLensError(Exception):
    """A problem with the user's input or data, reported without a traceback.

    ``message`` says what is wrong; ``hint`` says what to do about it.
    """

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ReferenceNotFound(ModuleLensError):
    """A name or reference that the repository does not hold."""


class InvalidName(ModuleLensError):
    """A name that could escape the repository or is otherwise malformed."""


class ChecksumMismatch(ModuleLensError):
    """A stored file whose bytes no longer match the sha256 in its manifest."""


class CaptureFailed(ModuleLensError):
    """A capture that did not produce an artifact (no match, script error, ...)."""


class ReplayFailed(ModuleLensError):
    """A replay strategy that could not run."""
