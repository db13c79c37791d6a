"""CDI specs of prepared claims: building, validation, atomic writes, and the prepared-claims checkpoint."""

from tangram.cdi.checkpoint import (
    CHECKPOINT_VERSION,
    CheckpointBody,
    CheckpointedClaim,
    CheckpointStore,
    ClaimState,
    CorruptCheckpoint,
    decode_checkpoint,
    encode_checkpoint,
    read_boot_id,
)
from tangram.cdi.devices import ClaimRef, ResolvedAllocation, ResolvedDevice
from tangram.cdi.names import InvalidName, validate_claim_uid, validate_device_name
from tangram.cdi.shares import share_edits
from tangram.cdi.spec import CdiKind, build_spec, cdi_device_id, cdi_device_name, spec_file_name
from tangram.cdi.validation import InvalidCdiSpec, spec_problems, validate_spec, validate_spec_bytes
from tangram.cdi.versions import KNOWN_VERSIONS, minimum_version
from tangram.cdi.writer import CdiSpecWriter

__all__ = [
    "CHECKPOINT_VERSION",
    "KNOWN_VERSIONS",
    "CdiKind",
    "CdiSpecWriter",
    "CheckpointBody",
    "CheckpointStore",
    "CheckpointedClaim",
    "ClaimRef",
    "ClaimState",
    "CorruptCheckpoint",
    "InvalidCdiSpec",
    "InvalidName",
    "ResolvedAllocation",
    "ResolvedDevice",
    "build_spec",
    "cdi_device_id",
    "cdi_device_name",
    "decode_checkpoint",
    "encode_checkpoint",
    "minimum_version",
    "read_boot_id",
    "share_edits",
    "spec_file_name",
    "spec_problems",
    "validate_claim_uid",
    "validate_device_name",
    "validate_spec",
    "validate_spec_bytes",
]
