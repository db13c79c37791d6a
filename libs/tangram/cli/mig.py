"""`tangram mig show`: each GPU's MIG layout as a diagram of its memory slices (read-only)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tangram.hardware.machines import MachineError
from tangram.hardware.migdiagram import render_node
from tangram.nvml import NvmlUnavailable, open_backend
from tangram.nvml.inventory import read_node_hardware
from tangram.nvml.sim.state import StateFileError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="mig_command", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print each GPU's MIG layout")
    source = show.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--sim", metavar="NAME_OR_FILE", help="a simulated machine (shipped name or YAML path)"
    )
    source.add_argument("--real", action="store_true", help="the real NVIDIA driver on this machine")
    show.add_argument("--state-file", type=Path, help="the simulator's shared state file")
    show.add_argument("--node", default="local", help="node name to print")


def run(args: argparse.Namespace) -> int:
    try:
        nvml = open_backend(sim=args.sim, state_file=args.state_file, real=args.real)
        try:
            hw = read_node_hardware(nvml, args.node)
        finally:
            nvml.nvmlShutdown()
    except (NvmlUnavailable, MachineError, StateFileError) as exc:
        print(f"tangram mig show: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"tangram mig show: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    sys.stdout.write(render_node(hw))
    return 0
