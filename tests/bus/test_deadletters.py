"""Dead letters always fit the server: whole when they can, by reference when they cannot."""

from __future__ import annotations

import hashlib

from tangram.bus.deadletters import MAX_REASON, PREFIX_BYTES, dead_letter
from tangram.events import DeadLetter, decode, encode

MB = 1024 * 1024


def letter(
    data: bytes, *, reason: str = "undecodable event: x", headers: dict[str, str] | None = None
) -> DeadLetter:
    return dead_letter(
        consumer="allocator",
        producer="test",
        subject="tangram.claim.requested.x",
        stream="TANGRAM_CLAIMS",
        sequence=42,
        deliveries=1,
        reason=reason,
        data=data,
        headers=headers or {"Nats-Msg-Id": "abc"},
        max_bytes=MB - 1024,
    )


def test_a_small_message_is_kept_whole_with_its_size_and_digest() -> None:
    kept = letter(b"garbage")
    assert kept.data == b"garbage" and not kept.truncated
    assert kept.size == 7 and kept.sha256 == hashlib.sha256(b"garbage").hexdigest()
    assert kept.headers == {"Nats-Msg-Id": "abc"}


def test_a_message_whose_letter_would_not_fit_is_kept_by_reference() -> None:
    # 780 KB is under the server's 1 MB, its base64 in a letter is not.
    data = bytes(range(256)) * (780 * 1024 // 256)
    kept = letter(data)
    assert kept.truncated and kept.data == data[:PREFIX_BYTES]
    assert kept.size == len(data) and kept.sha256 == hashlib.sha256(data).hexdigest()
    assert (kept.original_stream, kept.original_sequence) == ("TANGRAM_CLAIMS", 42)
    encoded = encode(kept)
    assert len(encoded) < 16 * 1024
    assert decode(encoded) == kept


def test_the_largest_message_that_fits_whole_is_kept_whole() -> None:
    # base64 is 4/3 of the bytes: about 760 KB still fits a letter under 1 MB.
    data = b"x" * (740 * 1024)
    kept = letter(data)
    assert not kept.truncated and kept.data == data
    assert len(encode(kept)) <= MB - 1024


def test_reason_and_headers_a_peer_controls_are_bounded() -> None:
    kept = letter(b"x", reason="r" * 100_000, headers={f"H{i}": "v" * 5000 for i in range(100)})
    assert len(kept.reason) == MAX_REASON and kept.reason.endswith("...")
    assert sum(len(k) + len(v) for k, v in kept.headers.items()) <= 8192
    assert all(len(v) <= 1024 for v in kept.headers.values())
