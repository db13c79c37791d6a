"""Configuration of the partitioner: the common node settings plus the NVML backend and policies."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from tangram.partitioning import CleanMode, WarmPoolError, parse_warm_pool
from tangram.service import NodeSettings, add_service_arguments, env_flag, service_fields, validated


class PartitionerSettings(NodeSettings):
    sim_machine: str | None = None  # a shipped simulated machine name or a machine YAML path
    state_file: Path | None = None  # the simulator's state, shared with other services of the node
    real: bool = False
    mig_minors_file: Path | None = None  # default: the driver's file, or the simulator's table
    clean_orphans: CleanMode = "empty"
    warm_pool: dict[str, int] = Field(default_factory=dict)
    # GPUs reconfigured at once. Commands for one GPU always run in log order, so a create and the
    # destroy after it for the same placement never swap.
    workers: int = Field(default=4, ge=1, le=64)
    claim_release_wait_s: float = Field(default=2.0, ge=0, le=60)

    @field_validator("warm_pool", mode="before")
    @classmethod
    def _parse_pool(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return parse_warm_pool(value)
            except WarmPoolError as exc:
                raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _one_backend(self) -> PartitionerSettings:
        if (self.sim_machine is None) == (not self.real):
            raise ValueError("choose exactly one NVML backend: --sim MACHINE or --real")
        if self.state_file is not None and self.sim_machine is None:
            raise ValueError("--state-file belongs to a simulated machine (--sim)")
        return self


def parse_settings(argv: list[str] | None = None) -> PartitionerSettings:
    parser = argparse.ArgumentParser(prog="python -m services.partitioner", description=__doc__)
    add_service_arguments(parser, node=True)
    env = os.environ.get
    backend = parser.add_mutually_exclusive_group()
    backend.add_argument("--sim", default=env("TANGRAM_SIM"), metavar="MACHINE", help="simulated machine")
    backend.add_argument(
        "--real", action="store_true", default=env_flag("TANGRAM_REAL_NVML"), help="real NVML"
    )
    parser.add_argument("--state-file", default=env("TANGRAM_SIM_STATE_FILE"), help="simulator state file")
    parser.add_argument(
        "--mig-minors-file",
        default=env("TANGRAM_MIG_MINORS_FILE"),
        help="MIG capability minors (default /proc/driver/nvidia-caps/mig-minors; generated on --sim)",
    )
    parser.add_argument(
        "--clean-orphans",
        choices=["none", "empty", "all"],
        default=env("TANGRAM_CLEAN_ORPHANS", "empty"),
        help="at start, destroy GPU instances without compute instances (empty), also instances "
        "Tangram created for claims that are gone (all), or nothing (none)",
    )
    parser.add_argument(
        "--warm-pool",
        default=env("TANGRAM_WARM_POOL", ""),
        help='freed instances kept per profile instead of destroyed, e.g. "1g.18gb=2,3g.71gb=1"',
    )
    parser.add_argument("--workers", type=int, default=int(env("TANGRAM_PARTITION_WORKERS", "4")))
    args = parser.parse_args(argv)
    if args.sim is not None and args.real:
        parser.error("choose one of --sim and --real")
    return validated(
        parser,
        lambda: PartitionerSettings(
            **service_fields(args),  # type: ignore[arg-type]
            sim_machine=args.sim,
            real=args.real and args.sim is None,
            state_file=args.state_file,
            mig_minors_file=args.mig_minors_file,
            clean_orphans=args.clean_orphans,
            warm_pool=args.warm_pool,
            workers=args.workers,
        ),
    )
