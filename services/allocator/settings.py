"""Configuration of the allocator service."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import get_args

from tangram.allocation import Policy
from tangram.service import ServiceSettings, add_service_arguments, service_fields


class AllocatorSettings(ServiceSettings):
    policy: Policy = "tangram"
    device_classes: Path | None = None  # a folder of DeviceClass YAML added to the shipped ones
    # Free MIG instances Tangram did not create may be destroyed to make room for a claim.
    reconfigure_foreign_instances: bool = False


def parse_settings(argv: list[str] | None = None) -> AllocatorSettings:
    parser = argparse.ArgumentParser(prog="python -m services.allocator", description=__doc__)
    add_service_arguments(parser)
    env = os.environ.get
    parser.add_argument("--policy", choices=get_args(Policy), default=env("TANGRAM_POLICY", "tangram"))
    parser.add_argument("--device-classes", default=env("TANGRAM_DEVICE_CLASSES"))
    parser.add_argument(
        "--reconfigure-foreign-instances",
        action="store_true",
        default=env("TANGRAM_RECONFIGURE_FOREIGN_INSTANCES", "") in ("1", "true"),
        help="let the allocator destroy free MIG instances that Tangram did not create",
    )
    args = parser.parse_args(argv)
    return AllocatorSettings(
        **service_fields(args),  # type: ignore[arg-type]
        policy=args.policy,
        device_classes=args.device_classes,
        reconfigure_foreign_instances=args.reconfigure_foreign_instances,
    )
