"""`tangram cluster up`: a local Kubernetes control plane with Tangram on simulated GPU nodes."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from tangram.cli.demo import parse_nodes
from tangram.local.clusterup import DECIDERS, serve
from tangram.local.controlplane import NEWEST, RELEASES, ControlPlaneError, release

# Machines that start without MIG instances: Kubernetes sees every placement as free, and one made
# before Tangram (as on the simulated HGX H200's GPU 0) would overlap placements it offers.
DEFAULT_NODES = ["node-a=dgx-h100", "node-b=h100-nvl-4x2"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser(
        "up", help="start the control plane, Tangram and the simulated nodes until Ctrl-C"
    )
    up.add_argument(
        "--node",
        action="append",
        metavar="NAME=MACHINE",
        help=f"a simulated node (repeatable; default {' '.join(DEFAULT_NODES)})",
    )
    up.add_argument(
        "--kubeconfig", type=Path, help="where to write the kubeconfig (default: in the work folder)"
    )
    up.add_argument("--keep", action="store_true", help="keep the work folder (logs, CDI specs, GPU state)")
    up.add_argument(
        "--decider",
        choices=DECIDERS,
        default="tangram",
        help="who decides the claims: tangram (as the Helm chart runs it: the admission webhook gates "
        "pods, the allocator writes the allocations) or kube-scheduler (no gate; Tangram adopts what "
        "it allocated); default tangram",
    )
    up.add_argument(
        "--k8s-version",
        default=NEWEST.minor,
        metavar="VERSION",
        help="the Kubernetes release of the control plane: "
        + " or ".join(r.minor for r in RELEASES)
        + f", or a full version (default {NEWEST.minor}, {NEWEST.version})",
    )


def run(args: argparse.Namespace) -> int:
    nodes = parse_nodes(args.node or DEFAULT_NODES, command="tangram cluster up")
    try:
        kubernetes = release(args.k8s_version)
    except ControlPlaneError as error:
        raise SystemExit(f"tangram cluster up: --k8s-version: {error}") from None

    def out(line: str) -> None:
        print(line, flush=True)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        return await serve(
            nodes,
            stop=stop,
            out=out,
            kubeconfig=args.kubeconfig,
            keep=args.keep,
            decider=args.decider,
            release=kubernetes,
        )

    try:
        return asyncio.run(main())
    except Exception as error:  # one line for a person, not a traceback
        print(f"tangram cluster up: {error}", file=sys.stderr)
        return 1
