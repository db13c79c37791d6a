"""`tangram demo`: every service as its own process on simulated GPUs, with an embedded NATS server."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys

from tangram.demo.cluster import LocalCluster, SimNode
from tangram.demo.driver import drive

DEFAULT_NODES = ["node-a=hgx-h200", "node-b=h100-nvl-4x2"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of claim churn (default 20)")
    parser.add_argument("--json", action="store_true", help="end with one JSON summary object on stdout")
    parser.add_argument(
        "--node",
        action="append",
        metavar="NAME=MACHINE",
        help=f"a simulated node (repeatable; default {' '.join(DEFAULT_NODES)})",
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the random claim churn")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, CDI specs)")


def parse_nodes(specs: list[str], *, command: str = "tangram demo") -> list[SimNode]:
    nodes = []
    for spec in specs:
        name, sep, machine = spec.partition("=")
        if not sep or not name or not machine:
            raise SystemExit(f"{command}: --node {spec!r} is not NAME=MACHINE")
        nodes.append(SimNode(name, machine))
    return nodes


def run(args: argparse.Namespace) -> int:
    if args.duration < 0:
        raise SystemExit("tangram demo: --duration must not be negative")
    cluster = LocalCluster(parse_nodes(args.node or DEFAULT_NODES))

    def out(line: str) -> None:
        print(line, flush=True)

    print(f"tangram demo: work folder {cluster.workdir}", flush=True)
    exit_codes: dict[str, int] = {}
    try:
        cluster.start()
        summary = asyncio.run(drive(cluster, duration_s=args.duration, seed=args.seed, out=out))
    except RuntimeError as error:
        print(f"tangram demo: {error}", file=sys.stderr)
        for service in cluster.processes:
            print(f"  log of {service.name}: {service.log_path}", file=sys.stderr)
        cluster.stop()
        return 1
    finally:
        exit_codes = cluster.stop()
    summary["services"] = exit_codes
    summary["clean_shutdown"] = all(code == 0 for code in exit_codes.values())
    if not args.keep:
        shutil.rmtree(cluster.workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(summary))
    else:
        print("\nsummary")
        for key, value in summary.items():
            print(f"  {key}: {value}")
    healthy = summary["clean_shutdown"] and summary["undecided"] == 0 and summary["prepare_failed"] == 0
    return 0 if healthy else 1
