"""`tangram chaos`: claims through every service on a 3-server NATS cluster while faults are
injected; prints what happened and any invariant violated (exit 1 when one is). With
`--kubernetes`, pods with Tangram claims on the real control plane instead, while the allocators,
the webhook, node services and the API server are killed (`tangram.chaos.kube`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
from pathlib import Path

from tangram.chaos import DEFAULT_NODES, ChaosConfig, chaos
from tangram.chaos.kube import KubeChaosConfig, kube_chaos
from tangram.cli.demo import parse_nodes
from tangram.local.controlplane import NEWEST, ControlPlaneError, release
from tangram.local.natsserver import NatsServerError


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--claims", type=_positive_int, default=300, help="claims to drive (default 300)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the claims and of the fault schedule")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument(
        "--duration-limit",
        type=_positive_seconds,
        default=900.0,
        metavar="S",
        help="no new claim after S seconds (default 900); the checks still run",
    )
    parser.add_argument(
        "--concurrency", type=_positive_int, default=12, help="claims alive at once (default 12)"
    )
    parser.add_argument(
        "--fault-interval",
        type=_positive_seconds,
        default=1.0,
        metavar="S",
        help="mean seconds between faults (default 1)",
    )
    parser.add_argument(
        "--node",
        action="append",
        metavar="NAME=MACHINE",
        help="a simulated node (repeatable; default "
        + " ".join(f"{n.name}={n.machine}" for n in DEFAULT_NODES)
        + ")",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, stores, CDI specs)")
    parser.add_argument(
        "--kubernetes",
        action="store_true",
        help="pods on the real control plane (--claims is the number of pods; faults: allocators, "
        "webhook, node services, the API server, pods and claims deleted mid-way)",
    )
    parser.add_argument(
        "--kubernetes-version",
        default=NEWEST.version,
        metavar="V",
        help=f"with --kubernetes: the control plane's release (default {NEWEST.version})",
    )


def run(args: argparse.Namespace) -> int:
    if args.kubernetes:
        return _run_kubernetes(args)
    config = ChaosConfig(
        claims=args.claims,
        seed=args.seed,
        duration_limit_s=args.duration_limit,
        concurrency=args.concurrency,
        fault_interval_s=args.fault_interval,
        nodes=tuple(parse_nodes(args.node)) if args.node else DEFAULT_NODES,
    )
    try:
        report, cluster = asyncio.run(chaos(config))
    except (RuntimeError, NatsServerError) as error:
        print(f"tangram chaos: {error}", file=sys.stderr)
        return 1
    return _print(args, report, cluster.workdir)


def _run_kubernetes(args: argparse.Namespace) -> int:
    try:
        config = KubeChaosConfig(
            pods=args.claims,
            seed=args.seed,
            duration_limit_s=args.duration_limit,
            concurrency=args.concurrency,
            fault_interval_s=args.fault_interval,
            nodes=tuple(parse_nodes(args.node)) if args.node else DEFAULT_NODES,
            release=release(args.kubernetes_version),
        )
        report, cluster = asyncio.run(kube_chaos(config))
    except (RuntimeError, NatsServerError, ControlPlaneError) as error:
        print(f"tangram chaos: {error}", file=sys.stderr)
        return 1
    return _print(args, report, cluster.workdir)


def _print(args: argparse.Namespace, report: dict[str, object], workdir: Path) -> int:
    if args.keep:
        report["work_folder"] = str(workdir)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")
    return 0 if not report["violations"] and report["completed"] else 1
