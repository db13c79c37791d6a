"""`tangram bench NAME`: benchmarks print one JSON object and compare with a baseline in the same run."""

from __future__ import annotations

import argparse
import importlib

from tangram.cli import OneLineParser

# benchmark -> module defining add_arguments(parser) and run(args) -> int
BENCHMARKS: dict[str, tuple[str, str]] = {
    "bus": ("tangram.bench.bus", "JetStream publish/consume throughput and latency vs plain nats-py"),
    "allocator": ("tangram.bench.allocator", "allocator decisions/s and latency at fleet scale vs first-fit"),
    "quality": ("tangram.bench.quality", "placement quality vs first-fit, best-fit and an ILP optimum"),
    "sharing": (
        "tangram.bench.sharing",
        "small inference claims sharing GPUs vs whole-GPU allocation, first-fit sharing and an ILP optimum",
    ),
    "e2e": (
        "tangram.bench.e2e",
        "claim -> CDI ready through every service at a sustained rate, with where the time goes",
    ),
    "prepare": ("tangram.bench.prepare", "kubelet NodePrepareResources latency with concurrent claims"),
    "kubernetes": (
        "tangram.bench.kubernetes",
        "pods with claims in a real control plane: kube-scheduler alone, and Tangram deciding",
    ),
    "tenants": (
        "tangram.bench.tenants",
        "a flood of claims from one namespace beside another's few: their latency alone and under it",
    ),
    "rebuild": ("tangram.bench.rebuild", "allocator cold restart: state rebuilt from the JetStream log"),
    "gangs": (
        "tangram.bench.gangs",
        "multi-pod jobs on GB200 NVL racks and HGX nodes placed as whole groups vs pod-at-a-time first-fit",
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("benchmark", choices=sorted(BENCHMARKS), help="which benchmark to run")
    parser.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's own options")


def run(args: argparse.Namespace) -> int:
    module_name, help_text = BENCHMARKS[args.benchmark]
    # Import only the benchmark asked for: each pulls in its own dependencies.
    module = importlib.import_module(module_name)
    parser = OneLineParser(prog=f"tangram bench {args.benchmark}", description=help_text)
    module.add_arguments(parser)
    result: int = module.run(parser.parse_args(args.options))
    return result
