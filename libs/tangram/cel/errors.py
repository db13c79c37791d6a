"""The two ways a selector can fail: it does not compile, or it does not evaluate to a bool."""

from __future__ import annotations


class CelError(Exception):
    """Base of every CEL selector error; the message is meant for the person who wrote it."""


class CelCompileError(CelError):
    """The expression is not a valid Kubernetes DRA selector (syntax, unknown name, too long, too costly)."""

    def __init__(self, message: str, *, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position


class CelRuntimeError(CelError):
    """Evaluating the expression against a device failed, or produced something other than a bool."""
