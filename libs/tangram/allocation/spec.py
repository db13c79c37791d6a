"""User input: ResourceClaim spec and DeviceClass (resource.k8s.io/v1); TopologyConfig: tangram.dra.config.

Validation errors name the field, so a claim that cannot be read fails with a reason a person can fix.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tangram.dra.config import describe_validation_error
from tangram.quantity import ceil_quantity

MAX_RESULTS = 32  # resource.k8s.io/v1 AllocationResultsMaxSize

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_QUALIFIED = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z_][A-Za-z0-9_]{0,31}$")

AllocationMode = Literal["ExactCount", "All"]
Quantity = Annotated[int, Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _label(value: str, what: str) -> str:
    if not _DNS_LABEL.match(value):
        raise ValueError(f"{what} {value!r} must be a DNS label (lower case letters, digits and '-')")
    return value


def _quantities(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    return {k: ceil_quantity(v) if isinstance(v, str | int) else v for k, v in value.items()}


class CelDeviceSelector(_Strict):
    expression: str = Field(min_length=1, max_length=10_000)


class DeviceSelector(_Strict):
    cel: CelDeviceSelector


class DeviceToleration(_Strict):
    key: str = ""
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "NoExecute"] = ""
    tolerationSeconds: int | None = None

    @model_validator(mode="after")
    def _exists_has_no_value(self) -> DeviceToleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("value must be empty when operator is Exists")
        if not self.key and self.operator != "Exists":
            raise ValueError("an empty key needs operator Exists")
        return self


class CapacityRequirements(_Strict):
    requests: dict[str, Quantity] = {}

    @field_validator("requests", mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        return _quantities(value)


class _Selection(_Strict):
    deviceClassName: str = Field(min_length=1)
    selectors: list[DeviceSelector] = Field(default=[], max_length=32)
    allocationMode: AllocationMode = "ExactCount"
    count: int | None = Field(default=None, ge=1, le=MAX_RESULTS)
    tolerations: list[DeviceToleration] = Field(default=[], max_length=16)
    capacity: CapacityRequirements | None = None

    @model_validator(mode="after")
    def _count_only_for_exact(self) -> _Selection:
        if self.allocationMode == "All" and self.count is not None:
            raise ValueError("count must not be set when allocationMode is All")
        return self

    @property
    def wanted(self) -> int:
        return self.count if self.count is not None else 1


class ExactDeviceRequest(_Selection):
    adminAccess: bool | None = None


class DeviceSubRequest(_Selection):
    name: str

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _label(value, "subrequest name")


class DeviceRequest(_Strict):
    name: str
    exactly: ExactDeviceRequest | None = None
    firstAvailable: list[DeviceSubRequest] | None = Field(default=None, min_length=1, max_length=8)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _label(value, "request name")

    @model_validator(mode="after")
    def _one_of(self) -> DeviceRequest:
        if (self.exactly is None) == (self.firstAvailable is None):
            raise ValueError("exactly one of exactly or firstAvailable must be set")
        if self.firstAvailable is not None:
            names = [s.name for s in self.firstAvailable]
            if len(set(names)) != len(names):
                raise ValueError(f"subrequest names must be unique, got {names}")
        return self


class DeviceConstraint(_Strict):
    requests: list[str] = []
    matchAttribute: str | None = None
    distinctAttribute: str | None = None

    @model_validator(mode="after")
    def _one_of(self) -> DeviceConstraint:
        if (self.matchAttribute is None) == (self.distinctAttribute is None):
            raise ValueError("exactly one of matchAttribute or distinctAttribute must be set")
        attribute = self.attribute
        if not _QUALIFIED.match(attribute):
            raise ValueError(f"attribute {attribute!r} must be fully qualified (domain/name)")
        return self

    @property
    def attribute(self) -> str:
        return self.matchAttribute if self.matchAttribute is not None else str(self.distinctAttribute)


class OpaqueDeviceConfiguration(_Strict):
    driver: str = Field(min_length=1)
    parameters: dict[str, Any]


class DeviceClaimConfiguration(_Strict):
    requests: list[str] = []
    opaque: OpaqueDeviceConfiguration | None = None


class DeviceClaim(_Strict):
    requests: list[DeviceRequest] = Field(default=[], max_length=MAX_RESULTS)
    constraints: list[DeviceConstraint] = Field(default=[], max_length=MAX_RESULTS)
    config: list[DeviceClaimConfiguration] = Field(default=[], max_length=MAX_RESULTS)

    @model_validator(mode="after")
    def _references(self) -> DeviceClaim:
        names = [r.name for r in self.requests]
        if len(set(names)) != len(names):
            raise ValueError(f"request names must be unique, got {names}")
        known = set(names)
        for request in self.requests:
            for sub in request.firstAvailable or []:
                known.add(f"{request.name}/{sub.name}")
        for where, entries in (("constraints", self.constraints), ("config", self.config)):
            for entry in entries:
                for name in entry.requests:
                    if name not in known:
                        raise ValueError(f"{where} names request {name!r}, which the claim does not have")
        total = sum(
            r.exactly.wanted for r in self.requests if r.exactly and r.exactly.allocationMode == "ExactCount"
        )
        if total > MAX_RESULTS:
            raise ValueError(
                f"the claim asks for {total} devices; at most {MAX_RESULTS} fit in one allocation"
            )
        return self


class ResourceClaimSpec(_Strict):
    devices: DeviceClaim = DeviceClaim()


class DeviceClassConfiguration(_Strict):
    opaque: OpaqueDeviceConfiguration | None = None


class DeviceClassSpec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    selectors: list[DeviceSelector] = Field(default=[], max_length=32)
    config: list[DeviceClassConfiguration] = Field(default=[], max_length=32)


class DeviceClass(BaseModel):
    """A DeviceClass by name; `from_manifest` reads a resource.k8s.io/v1 manifest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    spec: DeviceClassSpec = DeviceClassSpec()

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> DeviceClass:
        if manifest.get("kind") != "DeviceClass":
            raise ValueError(f"expected kind DeviceClass, got {manifest.get('kind')!r}")
        metadata = manifest.get("metadata") or {}
        if not isinstance(metadata, dict) or not metadata.get("name"):
            raise ValueError("DeviceClass manifest has no metadata.name")
        try:
            return cls.model_validate({"name": metadata["name"], "spec": manifest.get("spec") or {}})
        except ValidationError as err:
            raise ValueError(
                f"DeviceClass {metadata['name']}: {describe_validation_error(err, 'spec')}"
            ) from None


def parse_claim_spec(spec: Any) -> ResourceClaimSpec:
    """Raises ValueError with every problem named by its field."""
    if isinstance(spec, ResourceClaimSpec):
        return spec
    if not isinstance(spec, dict):
        raise ValueError(f"spec: expected a mapping, got {type(spec).__name__}")
    try:
        return ResourceClaimSpec.model_validate(spec)
    except ValidationError as err:
        raise ValueError(describe_validation_error(err, "spec")) from None
