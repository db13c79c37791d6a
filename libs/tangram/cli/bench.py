"""`tangram bench NAME`: benchmarks print one JSON object and compare with a baseline in the same run."""

from __future__ import annotations

import argparse
import importlib

# benchmark -> module defining add_arguments(parser) and run(args) -> int
BENCHMARKS: dict[str, tuple[str, str]] = {
    "bus": ("tangram.bench.bus", "JetStream publish/consume throughput and latency vs plain nats-py"),
    "allocator": ("tangram.bench.allocator", "allocator decisions/s and latency at fleet scale vs first-fit"),
    "quality": ("tangram.bench.quality", "placement quality vs first-fit, best-fit and an ILP optimum"),
    "prepare": ("tangram.bench.prepare", "kubelet NodePrepareResources latency with concurrent claims"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name, (module_name, help_text) in BENCHMARKS.items():
        bench_parser = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module_name).add_arguments(bench_parser)


def run(args: argparse.Namespace) -> int:
    module = importlib.import_module(BENCHMARKS[args.benchmark][0])
    result: int = module.run(args)
    return result
