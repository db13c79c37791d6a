"""Settings of the kubelet plugin: where kubelet, the CDI runtime and the GPU driver live on the node."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tangram import DRIVER_NAME

KUBELET_CALL_TIMEOUT_S = 45.0
UNIX_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class PluginConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    node_name: str = Field(min_length=1, max_length=253)
    driver_name: str = DRIVER_NAME
    kubelet_root: Path = Path("/var/lib/kubelet")
    cdi_dir: Path = Path("/var/run/cdi")
    driver_root: Path = Path("/")  # where the host's /dev is, seen from the container runtime
    # The toolkit's hook binary, run by the container runtime on the host.
    cdi_hook_path: Path = Path("/usr/bin/nvidia-cdi-hook")
    cdi_class: str = "claim"
    # Kubelet gives up after 45 s; answering with a per-claim error first lets it retry cleanly.
    resolve_timeout_s: float = Field(default=30.0, gt=0, lt=KUBELET_CALL_TIMEOUT_S)
    registration_check_interval_s: float = Field(default=1.0, gt=0)
    checkpoint_path: Path | None = None  # default: <plugin dir>/checkpoint.json
    boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id")

    @field_validator("driver_name")
    @classmethod
    def _driver_name_is_dns_subdomain(cls, value: str) -> str:
        if len(value) > 63 or not _DNS_SUBDOMAIN.match(value):
            raise ValueError(f"driver name {value!r} must be a DNS subdomain of at most 63 characters")
        return value

    @field_validator("driver_root", "kubelet_root", "cdi_dir", "cdi_hook_path")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError(f"{value} must be an absolute path")
        return value

    @model_validator(mode="after")
    def _sockets_fit(self) -> PluginConfig:
        for path in (self.registration_socket, self.dra_socket):
            if len(str(path).encode()) > UNIX_SOCKET_PATH_MAX:
                raise ValueError(
                    f"socket path {path} is longer than {UNIX_SOCKET_PATH_MAX} bytes; "
                    "use a shorter kubelet root"
                )
        return self

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_root / "plugins_registry"

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_root / "plugins" / self.driver_name

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{self.driver_name}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / "dra.sock"

    @property
    def checkpoint_file(self) -> Path:
        return self.checkpoint_path or self.plugin_dir / "checkpoint.json"
