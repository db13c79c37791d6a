"""Configuration of the cdi service: the common node settings plus where kubelet and CDI live."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pydantic import Field

from tangram import DRIVER_NAME
from tangram.kubelet import KUBELET_CALL_TIMEOUT_S
from tangram.service import NodeSettings, add_service_arguments, env_flag, service_fields


class CdiSettings(NodeSettings):
    driver_name: str = DRIVER_NAME
    kubelet_root: Path = Path("/var/lib/kubelet")
    cdi_dir: Path = Path("/var/run/cdi")
    driver_root: Path = Path("/")  # as the container runtime (on the host) sees it
    driver_root_mount: Path | None = None  # where this container sees the driver root; default: driver_root
    cdi_hook_path: Path = Path("/usr/bin/nvidia-cdi-hook")
    resolve_timeout_s: float = Field(default=30.0, gt=0, lt=KUBELET_CALL_TIMEOUT_S)
    kubernetes: bool = False  # resolve claims from the API server instead of the allocator's events
    kubeconfig: Path | None = None  # default: in-cluster service account, then $KUBECONFIG


def parse_settings(argv: list[str] | None = None) -> CdiSettings:
    parser = argparse.ArgumentParser(prog="python -m services.cdi", description=__doc__)
    add_service_arguments(parser, node=True)
    env = os.environ.get
    parser.add_argument("--driver-name", default=env("TANGRAM_DRIVER_NAME", DRIVER_NAME))
    parser.add_argument("--kubelet-root", default=env("TANGRAM_KUBELET_ROOT", "/var/lib/kubelet"))
    parser.add_argument("--cdi-dir", default=env("TANGRAM_CDI_DIR", "/var/run/cdi"))
    parser.add_argument("--driver-root", default=env("TANGRAM_DRIVER_ROOT", "/"))
    parser.add_argument(
        "--driver-root-mount",
        default=env("TANGRAM_DRIVER_ROOT_MOUNT") or None,
        help="where this container sees the driver root (default: --driver-root)",
    )
    parser.add_argument("--cdi-hook-path", default=env("TANGRAM_CDI_HOOK_PATH", "/usr/bin/nvidia-cdi-hook"))
    parser.add_argument(
        "--resolve-timeout", type=float, default=float(env("TANGRAM_RESOLVE_TIMEOUT", "30")), dest="resolve"
    )
    parser.add_argument(
        "--kubernetes",
        action="store_true",
        default=env_flag("TANGRAM_KUBERNETES"),
        help="read claims from the Kubernetes API, their source of truth (env TANGRAM_KUBERNETES=1)",
    )
    parser.add_argument("--kubeconfig", default=env("TANGRAM_KUBECONFIG"), help="kubeconfig file")
    args = parser.parse_args(argv)
    return CdiSettings(
        **service_fields(args),  # type: ignore[arg-type]
        driver_name=args.driver_name,
        kubelet_root=args.kubelet_root,
        cdi_dir=args.cdi_dir,
        driver_root=args.driver_root,
        driver_root_mount=args.driver_root_mount,
        cdi_hook_path=args.cdi_hook_path,
        resolve_timeout_s=args.resolve,
        kubernetes=args.kubernetes,
        kubeconfig=args.kubeconfig,
    )
