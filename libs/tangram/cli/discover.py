"""`tangram discover`: read a node's GPUs (simulated or real) and print its inventory or ResourceSlices."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, cast

from tangram import DRIVER_NAME
from tangram.dra import node_devices
from tangram.events import NodeHardware, NodeInventory, encode, subject_token
from tangram.events.envelope import InvalidKey
from tangram.kubernetes.objects.limits import DNS_SUBDOMAIN, K8S_VERSIONS, MAX_SUBDOMAIN, K8sVersion
from tangram.kubernetes.objects.slices import SliceRenderError, render_slices

EXIT_NO_DRIVER = 1
EXIT_BAD_INPUT = 2


class DiscoverError(Exception):
    """A one-line reason `tangram discover` cannot go on, with the exit status to use."""

    def __init__(self, message: str, status: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.status = status


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--sim", metavar="NAME_OR_FILE", help="a shipped simulated machine or a machine YAML file"
    )
    source.add_argument("--real", action="store_true", help="read the GPUs of this machine through NVML")
    parser.add_argument("--format", choices=("inventory", "slices"), default="inventory")
    parser.add_argument("--k8s-version", choices=K8S_VERSIONS, default=K8S_VERSIONS[-1])
    parser.add_argument(
        "--node", help="node name (default: the machine name with --sim, NODE_NAME or host name)"
    )
    parser.add_argument("--driver", default=DRIVER_NAME, help=f"DRA driver name (default {DRIVER_NAME})")
    parser.add_argument("--state-file", type=Path, help="simulator state shared with other processes")
    parser.add_argument("--generation", type=int, default=1, help="pool generation written in the slices")


def _node_name(args: argparse.Namespace) -> str:
    if args.node:
        node = str(args.node)
    elif args.sim:
        node = Path(str(args.sim)).stem.lower()
    else:
        node = os.environ.get("NODE_NAME") or socket.gethostname().lower()
    if len(node) > MAX_SUBDOMAIN or not DNS_SUBDOMAIN.match(node):
        raise DiscoverError(f"node name {node!r} is not a valid Kubernetes node name (DNS subdomain)")
    return node


def _read_hardware(args: argparse.Namespace, node: str) -> NodeHardware:
    # NVML, pynvml and the simulator are loaded only here, so the rest of the command stays pure
    from pynvml import NVMLError  # noqa: PLC0415

    from tangram.hardware.machines import MachineError  # noqa: PLC0415
    from tangram.nvml import NvmlUnavailable, open_backend  # noqa: PLC0415
    from tangram.nvml.inventory import read_node_hardware  # noqa: PLC0415
    from tangram.nvml.sim.state import StateFileError  # noqa: PLC0415

    try:
        if args.real:
            nvml = open_backend(real=True)
        else:
            nvml = open_backend(sim=str(args.sim), state_file=args.state_file)
    except NvmlUnavailable as exc:
        raise DiscoverError(_one_line(exc), EXIT_NO_DRIVER) from None
    except (MachineError, StateFileError, OSError) as exc:
        raise DiscoverError(_one_line(exc)) from None
    try:
        hardware: NodeHardware = read_node_hardware(nvml, node)
    except NVMLError as exc:
        raise DiscoverError(f"reading the GPUs failed: {_one_line(exc)}", EXIT_NO_DRIVER) from None
    finally:
        nvml.nvmlShutdown()
    return hardware


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _output(args: argparse.Namespace, hardware: NodeHardware) -> Any:
    if args.format == "inventory":
        event = NodeInventory(
            key=subject_token(hardware.node),
            hardware=hardware,
            producer="discover",
            generation=args.generation,
        )
        return json.loads(encode(event))
    devices = node_devices(hardware, driver=args.driver)
    return render_slices(
        devices,
        k8s_version=cast(K8sVersion, args.k8s_version),
        generation=args.generation,
        driver=args.driver,
    )


def run(args: argparse.Namespace) -> int:
    try:
        if args.generation < 0:
            raise DiscoverError(f"--generation must not be negative, got {args.generation}")
        if args.state_file is not None and args.real:
            raise DiscoverError("--state-file is for the simulator; it cannot be used with --real")
        node = _node_name(args)
        hardware = _read_hardware(args, node)
        output = _output(args, hardware)
    except DiscoverError as exc:
        print(f"tangram discover: {exc}", file=sys.stderr)
        return exc.status
    except (SliceRenderError, InvalidKey) as exc:
        print(f"tangram discover: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    json.dump(output, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
