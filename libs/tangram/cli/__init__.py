"""The `tangram` command. Each subcommand lives in its own module, imported only when used."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

# subcommand -> (module, one-line help). A module defines `add_arguments(parser)` and `run(args) -> int`.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("tangram.cli.demo", "run the services on simulated GPUs with an embedded NATS server"),
    "cluster": ("tangram.cli.cluster", "a local Kubernetes control plane with Tangram on simulated nodes"),
    "schema": ("tangram.cli.schema", "print the event catalogue as one AsyncAPI 3 document"),
    "bench": ("tangram.cli.bench", "run a benchmark and print one JSON object"),
    "discover": ("tangram.cli.discover", "print a node's inventory or ResourceSlices"),
    "allocate": ("tangram.cli.allocate", "run the allocator offline over a fleet and a claim trace"),
    "mig": ("tangram.cli.mig", "show MIG layouts"),
    "nats-config": ("tangram.cli.nats_config", "write nats-server authorization with per-node permissions"),
    "log": ("tangram.cli.log", "export the claim, node and inventory streams to a portable file"),
    "replay": ("tangram.cli.replay", "decide a log's claims again offline and report divergences"),
    "explain": ("tangram.cli.explain", "why a claim was placed where it was, or why it failed"),
    "status": ("tangram.cli.status", "the fleet now: MIG layouts, NVLink domains, claims, services"),
    "ui": ("tangram.cli.ui", "serve a read-only web view of the fleet, live from the bus"),
    "chaos": ("tangram.cli.chaos", "inject faults while claims flow through every service; check invariants"),
}


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line, like every other error of the command (`--help` shows the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = OneLineParser(prog="tangram", description="Tangram: GPU DRA driver tooling")
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
    try:
        result: int = module.run(args)
    except KeyboardInterrupt:
        print(f"tangram {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Whoever read stdout stopped (`| head`); point stdout at nothing so the exit flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:
        # Each command reports the errors it expects as one line naming the problem; this is the
        # last line of defence, still one line, never a traceback.
        text = " ".join(str(exc).split())[:500] or "(no message)"
        print(f"tangram {args.command}: unexpected error: {type(exc).__name__}: {text}", file=sys.stderr)
        return 70
    return result


if __name__ == "__main__":
    sys.exit(main())
