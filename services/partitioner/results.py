"""The result events of partition commands; their ids derive from the command id, so a retried
publish after a crash is de-duplicated instead of stored as a second, different result."""

from __future__ import annotations

from typing import Any

from tangram.events import PartitionApplied, PartitionFailed, PartitionRequested, subject_token
from tangram.partitioning import CreatedInstance, DestroyedInstance, PartitionError


def result_id(command_id: str) -> str:
    return f"{command_id}-result"


def _answering(command: PartitionRequested, producer: str) -> dict[str, Any]:
    """What every result of a command repeats from it."""
    return {
        "key": subject_token(command.node),
        "event_id": result_id(command.command_id),
        "producer": producer,
        "command_id": command.command_id,
        "node": command.node,
        "claim_uid": command.claim_uid,
    }


def _instance(instance: CreatedInstance) -> dict[str, Any]:
    return {
        "gpu_uuid": instance.gpu_uuid,
        "gpu_index": instance.gpu_index,
        "profile": instance.profile,
        "placement": instance.placement,
        "mig_uuid": instance.mig_uuid,
        "gpu_instance_id": instance.gpu_instance_id,
        "compute_instance_id": instance.compute_instance_id,
        "gi_cap_minor": instance.gi_cap_minor,
        "ci_cap_minor": instance.ci_cap_minor,
    }


def created(
    command: PartitionRequested, made: CreatedInstance, *, producer: str, ms: float
) -> PartitionApplied:
    return PartitionApplied(
        **_answering(command, producer), **_instance(made), action="create", duration_ms=ms
    )


def kept(
    command: PartitionRequested, instance: CreatedInstance, *, producer: str, ms: float
) -> PartitionApplied:
    """A destroy answered by keeping the instance warm; its ids stay filled in."""
    return PartitionApplied(
        **_answering(command, producer),
        **_instance(instance),
        action="destroy",
        duration_ms=ms,
        kept_warm=True,
    )


def destroyed(
    command: PartitionRequested, gone: DestroyedInstance | None, *, producer: str, ms: float
) -> PartitionApplied:
    """The instance is gone (`gone` is None when it already was): ids are -1."""
    return PartitionApplied(
        **_answering(command, producer),
        action="destroy",
        gpu_uuid=command.gpu_uuid,
        gpu_index=gone.gpu_index if gone else command.gpu_index,
        profile=gone.profile if gone else command.profile,
        placement=command.placement,
        mig_uuid=gone.mig_uuid if gone else command.mig_uuid,
        duration_ms=ms,
    )


def mig_disabled(command: PartitionRequested, *, producer: str, ms: float) -> PartitionApplied:
    """MIG mode is off on the command's GPU (it may have been already)."""
    return PartitionApplied(
        **_answering(command, producer),
        action="disable-mig",
        gpu_uuid=command.gpu_uuid,
        gpu_index=command.gpu_index,
        profile=command.profile,
        placement=command.placement,
        duration_ms=ms,
    )


def failed(command: PartitionRequested, error: PartitionError, *, producer: str) -> PartitionFailed:
    return PartitionFailed(
        **_answering(command, producer),
        action=command.action,
        gpu_uuid=command.gpu_uuid,
        profile=command.profile,
        placement=command.placement,
        nvml_error=error.nvml_error,
        reason=error.reason,
    )
