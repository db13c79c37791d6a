"""The checkpoint's on-disk schema: round trip, a pinned document, and what counts as corrupt."""

from __future__ import annotations

import hashlib

import pytest

from tangram.cdi import (
    CheckpointBody,
    CheckpointedClaim,
    ClaimRef,
    CorruptCheckpoint,
    ResolvedAllocation,
    ResolvedDevice,
    decode_checkpoint,
    encode_checkpoint,
)

MIG_CLAIM = ResolvedAllocation(
    claim=ClaimRef(namespace="ml", name="embed", uid="2d8b8e77-5b2a-4e6a-9c7b-4f5b4e3b9c03"),
    devices=[
        ResolvedDevice(
            request="mig",
            pool="node-a",
            device="gpu-1-mig-1g10gb-2",
            gpu_index=1,
            gpu_uuid="GPU-1",
            gpu_minor=3,
            mig_uuid="MIG-2",
            profile="1g.10gb",
            gi_cap_minor=122,
            ci_cap_minor=123,
        )
    ],
)

BODY_V1 = (
    b'{"boot_id":"b-1","claims":{"2d8b8e77-5b2a-4e6a-9c7b-4f5b4e3b9c03":{"state":"prepared","allocation":'
    b'{"claim":{"namespace":"ml","name":"embed","uid":"2d8b8e77-5b2a-4e6a-9c7b-4f5b4e3b9c03"},"devices":'
    b'[{"request":"mig","pool":"node-a","device":"gpu-1-mig-1g10gb-2","gpu_index":1,"gpu_uuid":"GPU-1",'
    b'"gpu_minor":3,"mig_uuid":"MIG-2","profile":"1g.10gb","gi_cap_minor":122,"ci_cap_minor":123}]}}}}'
)

# What version 1 writes since devices carry their share and GPU instance id and claims their IMEX
# channel and pods (fields with defaults: files written before them, BODY_V1, still read the same)
WRITTEN_V1 = BODY_V1.replace(
    b'"ci_cap_minor":123}]}',
    b'"ci_cap_minor":123,"share":null,"gpu_instance_id":-1}],"imex":null,"pods":[]}',
)


def test_round_trip() -> None:
    body = CheckpointBody(
        boot_id="b-1", claims={MIG_CLAIM.claim.uid: CheckpointedClaim(state="prepared", allocation=MIG_CLAIM)}
    )
    assert decode_checkpoint(encode_checkpoint(body)) == body


def test_version_1_document_on_disk_stays_readable() -> None:
    checksum = "sha256:" + hashlib.sha256(BODY_V1).hexdigest()
    document = b'{"version":1,"checksum":"' + checksum.encode() + b'","body":' + BODY_V1 + b"}"
    body = decode_checkpoint(document)
    assert body.boot_id == "b-1"
    assert body.claims == {MIG_CLAIM.claim.uid: CheckpointedClaim(state="prepared", allocation=MIG_CLAIM)}


def test_encoding_is_the_pinned_version_1_layout() -> None:
    body = CheckpointBody(
        boot_id="b-1", claims={MIG_CLAIM.claim.uid: CheckpointedClaim(state="prepared", allocation=MIG_CLAIM)}
    )
    checksum = "sha256:" + hashlib.sha256(WRITTEN_V1).hexdigest()
    assert (
        encode_checkpoint(body)
        == b'{"version":1,"checksum":"' + checksum.encode() + b'","body":' + WRITTEN_V1 + b"}"
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "not a versioned JSON document"),
        (b"[1,2]", "not a versioned JSON document"),
        (b'{"version":2,"checksum":"","body":{}}', "version 2 is not supported"),
        (b'{"version":1,"checksum":"sha256:abc","body":{"boot_id":"x"}}', "checksum does not match"),
        (b'{"version":1,"body":{"boot_id":"x"}}', "envelope is invalid"),
    ],
)
def test_corrupt_documents_are_named_as_such(raw: bytes, message: str) -> None:
    with pytest.raises(CorruptCheckpoint, match=message):
        decode_checkpoint(raw)


def test_valid_checksum_over_a_wrong_body_is_still_corrupt() -> None:
    body = b'{"boot_id":"x","claims":{"u":{"state":"gone"}}}'
    raw = (
        b'{"version":1,"checksum":"sha256:'
        + hashlib.sha256(body).hexdigest().encode()
        + b'","body":'
        + body
        + b"}"
    )
    with pytest.raises(CorruptCheckpoint, match="body is invalid"):
        decode_checkpoint(raw)
