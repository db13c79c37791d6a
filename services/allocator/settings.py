"""Configuration of the allocator service."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import get_args

from pydantic import Field

from tangram.allocation import Policy
from tangram.service import ServiceSettings, add_service_arguments, env_flag, service_fields, validated


class AllocatorSettings(ServiceSettings):
    policy: Policy = "tangram"
    device_classes: Path | None = None  # a folder of DeviceClass YAML added to the shipped ones
    # Free MIG instances Tangram did not create may be destroyed to make room for a claim.
    reconfigure_foreign_instances: bool = False
    # Decide the cluster's claims: watch ResourceClaims, write status.allocation, remove the gate.
    kubernetes: bool = False
    kubeconfig: Path | None = None  # default: in-cluster service account, then $KUBECONFIG
    # where the allocator's Lease (tangram-allocator) is kept; None: the pod's own, else tangram-system
    kubernetes_namespace: str | None = None
    # restore the ledger image at start and fold only the log after it; write one after each rebuild
    ledger_image: bool = True
    # while leading, the image is taken again (from the last one and the log after it, in the
    # background) this often, once the claims stream has grown by this many events since it
    image_every_s: float = Field(default=600.0, gt=0)
    image_after_events: int = Field(default=20_000, ge=1)
    # A deleted claim is forgotten this long after its release (by the claims stream's clock). At
    # least 5 minutes: resends of what came before the deletion are de-duplicated for 2.
    forget_deleted_after_s: float = Field(default=3600.0, ge=300)


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
    parser.add_argument(
        "--kubernetes",
        action="store_true",
        default=env_flag("TANGRAM_KUBERNETES"),
        help="decide the cluster's ResourceClaims of Tangram's classes (env TANGRAM_KUBERNETES=1)",
    )
    parser.add_argument("--kubeconfig", default=env("TANGRAM_KUBECONFIG"), help="kubeconfig file")
    parser.add_argument(
        "--kubernetes-namespace",
        default=env("TANGRAM_NAMESPACE") or None,
        help="namespace of the allocator's Lease tangram-allocator (env TANGRAM_NAMESPACE; default: "
        "the pod's own, else tangram-system)",
    )
    parser.add_argument(
        "--no-ledger-image",
        dest="ledger_image",
        action="store_false",
        default=not env_flag("TANGRAM_NO_LEDGER_IMAGE"),
        help="fold the whole log at every start, and write no ledger image (env TANGRAM_NO_LEDGER_IMAGE=1)",
    )
    parser.add_argument(
        "--image-every",
        type=float,
        default=env("TANGRAM_IMAGE_EVERY_S", "600"),  # argparse converts a string default too
        help="seconds between checks whether to take the ledger image again (env TANGRAM_IMAGE_EVERY_S)",
    )
    parser.add_argument(
        "--image-after-events",
        type=int,
        default=env("TANGRAM_IMAGE_AFTER_EVENTS", "20000"),
        help="claim events logged since the image that have it taken again (env TANGRAM_IMAGE_AFTER_EVENTS)",
    )
    parser.add_argument(
        "--forget-deleted-after",
        type=float,
        default=env("TANGRAM_FORGET_DELETED_AFTER_S", "3600"),
        help="seconds after its deletion that a claim is forgotten; at least 300 "
        "(env TANGRAM_FORGET_DELETED_AFTER_S)",
    )
    args = parser.parse_args(argv)
    return validated(
        parser,
        lambda: AllocatorSettings(
            **service_fields(args),  # type: ignore[arg-type]
            policy=args.policy,
            device_classes=args.device_classes,
            reconfigure_foreign_instances=args.reconfigure_foreign_instances,
            kubernetes=args.kubernetes,
            kubeconfig=args.kubeconfig,
            kubernetes_namespace=args.kubernetes_namespace,
            ledger_image=args.ledger_image,
            image_every_s=args.image_every,
            image_after_events=args.image_after_events,
            forget_deleted_after_s=args.forget_deleted_after,
        ),
    )
