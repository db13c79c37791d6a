"""Dead letters that always fit: a message too large to carry whole is kept by reference."""

from __future__ import annotations

import hashlib

import msgspec

from tangram.events import DeadLetter, encode, subject_token

PREFIX_BYTES = 4096  # of a message kept by reference: enough to see what it was
MAX_REASON = 2000  # characters; a handler's exception text can be anything a peer provoked
MAX_HEADER_VALUE = 1024
MAX_HEADERS_BYTES = 8192


def dead_letter(
    *,
    consumer: str,
    producer: str,
    subject: str,
    stream: str,
    sequence: int,
    deliveries: int,
    reason: str,
    data: bytes,
    headers: dict[str, str],
    max_bytes: int,
) -> DeadLetter:
    """The dead letter of one message: whole when its encoding fits `max_bytes`, else by reference.

    By reference, `data` is the message's first bytes and the letter names its stream, sequence,
    size and SHA-256, which is what is needed to find the original while the stream keeps it, or
    to recognise it again.
    """
    letter = DeadLetter(
        key=subject_token(consumer),
        producer=producer,
        consumer=consumer,
        original_subject=subject,
        original_stream=stream,
        original_sequence=sequence,
        deliveries=deliveries,
        reason=_bounded(reason, MAX_REASON),
        data=data,
        headers=_bounded_headers(headers),
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )
    if len(encode(letter)) <= max_bytes:
        return letter
    return msgspec.structs.replace(letter, data=data[:PREFIX_BYTES], truncated=True)


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bounded_headers(headers: dict[str, str]) -> dict[str, str]:
    """The original headers, each value and their total bounded (headers are the sender's too)."""
    kept: dict[str, str] = {}
    total = 0
    for raw_name, raw_value in headers.items():
        name, value = _bounded(str(raw_name), 256), _bounded(str(raw_value), MAX_HEADER_VALUE)
        total += len(name) + len(value)
        if total > MAX_HEADERS_BYTES:
            break
        kept[name] = value
    return kept
