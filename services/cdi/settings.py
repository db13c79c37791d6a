"""Configuration of the cdi service: the common node settings plus where kubelet and CDI live."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pydantic import Field, model_validator

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
    # Device sharing (MPS control daemons, compute mode) needs NVML: a simulated machine or the
    # real driver. Without either, a claim holding a share is refused at prepare.
    sim_machine: str | None = None
    state_file: Path | None = None
    real: bool = False
    mps_root: Path = Path("/run/tangram/mps")  # <device UUID>/pipe and /log of each daemon
    mps_control: tuple[str, ...] = ()  # the MPS control program; default: NVIDIA's, or the stand-in
    imex_root: Path = Path("/run/tangram/imex")  # <namespace>_<group>/ config of each domain's daemon
    imex_daemon: tuple[str, ...] = ()  # the IMEX daemon program; default: nvidia-imex, or the stand-in

    @model_validator(mode="after")
    def _one_backend(self) -> CdiSettings:
        if self.sim_machine is not None and self.real:
            raise ValueError("choose one NVML backend for device sharing: --sim MACHINE or --real")
        if self.state_file is not None and self.sim_machine is None:
            raise ValueError("--state-file belongs to a simulated machine (--sim)")
        if not self.mps_root.is_absolute():
            raise ValueError(f"--mps-root {self.mps_root} must be an absolute path")
        if not self.imex_root.is_absolute():
            raise ValueError(f"--imex-root {self.imex_root} must be an absolute path")
        return self

    @property
    def sharing(self) -> bool:
        return self.sim_machine is not None or self.real


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
    backend = parser.add_mutually_exclusive_group()
    backend.add_argument(
        "--sim", default=env("TANGRAM_SIM"), metavar="MACHINE", help="simulated machine (device sharing)"
    )
    backend.add_argument(
        "--real",
        action="store_true",
        default=env_flag("TANGRAM_REAL_NVML"),
        help="real NVML (sharing)",
    )
    parser.add_argument("--state-file", default=env("TANGRAM_SIM_STATE_FILE"), help="simulator state file")
    parser.add_argument(
        "--mps-root",
        default=env("TANGRAM_MPS_ROOT", "/run/tangram/mps"),
        help="pipe and log directories of the MPS control daemons, one per shared device",
    )
    parser.add_argument(
        "--mps-control",
        default=env("TANGRAM_MPS_CONTROL", ""),
        help="the MPS control program (default nvidia-cuda-mps-control; the simulator's stand-in with --sim)",
    )
    parser.add_argument(
        "--imex-root",
        default=env("TANGRAM_IMEX_ROOT", "/run/tangram/imex"),
        help="config directories of the IMEX daemons of the NVLink domains this node serves",
    )
    parser.add_argument(
        "--imex-daemon",
        default=env("TANGRAM_IMEX_DAEMON", ""),
        help="the IMEX daemon program (default nvidia-imex; the simulator's stand-in with --sim)",
    )
    args = parser.parse_args(argv)
    if args.sim is not None and args.real:
        parser.error("choose one of --sim and --real")
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
        sim_machine=args.sim,
        real=args.real and args.sim is None,
        state_file=args.state_file,
        mps_root=args.mps_root,
        mps_control=tuple(args.mps_control.split()),
        imex_root=args.imex_root,
        imex_daemon=tuple(args.imex_daemon.split()),
    )
