"""The `tangram` command. Each subcommand lives in its own module, imported only when used."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> (module, one-line help). A module defines `add_arguments(parser)` and `run(args) -> int`.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("tangram.cli.demo", "run the services on simulated GPUs with an embedded NATS server"),
    "cluster": ("tangram.cli.cluster", "a local Kubernetes control plane with Tangram on simulated nodes"),
    "schema": ("tangram.cli.schema", "print the event catalogue as one JSON Schema document"),
    "bench": ("tangram.cli.bench", "run a benchmark and print one JSON object"),
    "discover": ("tangram.cli.discover", "print a node's inventory or ResourceSlices"),
    "allocate": ("tangram.cli.allocate", "run the allocator offline over a fleet and a claim trace"),
    "mig": ("tangram.cli.mig", "show MIG layouts"),
    "nats-config": ("tangram.cli.nats_config", "write nats-server authorization with per-node permissions"),
}


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tangram", description="Tangram: GPU DRA driver tooling")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:
            importlib.import_module(module_name).add_arguments(command_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list)
    args = parser.parse_args(args_list)
    module = importlib.import_module(COMMANDS[args.command][0])
    result: int = module.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
