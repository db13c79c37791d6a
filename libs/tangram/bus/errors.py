"""What a handler raises to tell the consumer what happened, and the bus's one error type."""

from __future__ import annotations


class BusError(RuntimeError):
    """Any failure talking to NATS, converted once at the choke point."""


class Retry(Exception):
    """Transient failure: redeliver after `delay` seconds (or the consumer's backoff)."""

    def __init__(self, reason: str, delay: float | None = None) -> None:
        super().__init__(reason)
        self.delay = delay


class Poison(Exception):
    """The message can never be handled: terminate it and keep it in the dead letter."""
