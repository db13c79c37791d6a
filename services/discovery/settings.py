"""Configuration of the discovery service."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pydantic import Field, model_validator

from services.discovery.topology import LABEL_KEY, NETWORK_BLOCK_LABEL
from tangram import DRIVER_NAME
from tangram.kubernetes.objects import K8S_VERSIONS, K8sVersion
from tangram.service import NodeSettings, add_service_arguments, env_flag, service_fields


class DiscoverySettings(NodeSettings):
    sim: str | None = None  # a shipped simulated machine name or a machine YAML path
    state_file: Path | None = None  # simulated GPU state shared with the node's other services
    real: bool = False
    refresh_s: float = Field(default=10.0, gt=0)  # re-read NVML this often; publish only on change
    mig_minors_file: Path | None = None  # default: the driver's /proc/driver/nvidia-caps/mig-minors
    kubernetes: bool = False  # also publish the inventory as ResourceSlices
    kubeconfig: Path | None = None  # default: in-cluster service account, then $KUBECONFIG
    # the slice layout; None: asked of the API server (served versions, dry-run probe)
    k8s_version: K8sVersion | None = None
    driver: str = Field(default=DRIVER_NAME, min_length=1, max_length=63)
    # Slices unsynced this long make the service not ready: the cluster's view of the node is stale.
    slice_stale_s: float = Field(default=120.0, gt=0)
    # the Node label naming the network block the node sits under (read with --kubernetes)
    network_block_label: str = Field(default=NETWORK_BLOCK_LABEL, pattern=LABEL_KEY.pattern, max_length=317)

    @model_validator(mode="after")
    def _one_backend(self) -> DiscoverySettings:
        if (self.sim is None) == (not self.real):
            raise ValueError("choose exactly one of --sim MACHINE or --real")
        return self


def parse_settings(argv: list[str] | None = None) -> DiscoverySettings:
    parser = argparse.ArgumentParser(prog="python -m services.discovery", description=__doc__)
    add_service_arguments(parser, node=True)
    env = os.environ.get
    parser.add_argument("--sim", default=env("TANGRAM_SIM"), help="simulated machine name or YAML file")
    parser.add_argument("--state-file", default=env("TANGRAM_SIM_STATE_FILE"))
    parser.add_argument("--real", action="store_true", default=env_flag("TANGRAM_REAL_NVML"))
    parser.add_argument("--refresh", type=float, default=float(env("TANGRAM_REFRESH_SECONDS", "10")))
    parser.add_argument("--mig-minors-file", default=env("TANGRAM_MIG_MINORS_FILE"))
    parser.add_argument(
        "--kubernetes",
        action="store_true",
        default=env_flag("TANGRAM_KUBERNETES"),
        help="publish ResourceSlices to the Kubernetes API (env TANGRAM_KUBERNETES=1)",
    )
    parser.add_argument("--kubeconfig", default=env("TANGRAM_KUBECONFIG"), help="kubeconfig file")
    parser.add_argument(
        "--k8s-version",
        choices=K8S_VERSIONS,
        default=env("TANGRAM_K8S_VERSION") or None,
        help="ResourceSlice layout override (default: detected from the API server)",
    )
    parser.add_argument("--driver", default=env("TANGRAM_DRIVER_NAME", DRIVER_NAME), help="DRA driver name")
    parser.add_argument(
        "--slice-stale",
        type=float,
        default=float(env("TANGRAM_SLICE_STALE_SECONDS", "120")),
        help="not ready once ResourceSlices could not be synced for this long (seconds)",
    )
    parser.add_argument(
        "--network-block-label",
        default=env("TANGRAM_NETWORK_BLOCK_LABEL", NETWORK_BLOCK_LABEL),
        help="Node label naming the node's network block, for placing groups of pods under one",
    )
    args = parser.parse_args(argv)
    return DiscoverySettings(
        **service_fields(args),  # type: ignore[arg-type]
        sim=args.sim,
        state_file=args.state_file,
        real=args.real,
        refresh_s=args.refresh,
        mig_minors_file=args.mig_minors_file,
        kubernetes=args.kubernetes,
        kubeconfig=args.kubeconfig,
        k8s_version=args.k8s_version,
        driver=args.driver,
        slice_stale_s=args.slice_stale,
        network_block_label=args.network_block_label,
    )
