"""Writes and removes per-claim CDI spec files, only ever inside the CDI directory. Blocking I/O."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec

from tangram.cdi.atomic import atomic_write, remove_durably
from tangram.cdi.devices import ResolvedAllocation
from tangram.cdi.driver import DriverFiles
from tangram.cdi.names import InvalidName, validate_claim_uid
from tangram.cdi.spec import (
    DEFAULT_HOOK_PATH,
    HOST_ROOT,
    CdiKind,
    allocation_from_spec,
    build_spec,
    spec_file_name,
    spec_file_prefix,
)
from tangram.cdi.validation import validate_spec

log = logging.getLogger(__name__)

SPEC_FILE_MODE = 0o644  # the container runtime, not only root, reads specs
CDI_DIR_MODE = 0o755


class CdiSpecWriter:
    def __init__(
        self,
        cdi_dir: Path,
        *,
        kind: CdiKind,
        driver_root: PurePosixPath = HOST_ROOT,
        driver: DriverFiles | None = None,
        hook_path: PurePosixPath = DEFAULT_HOOK_PATH,
        share_root: PurePosixPath | None = None,
    ) -> None:
        self.cdi_dir = cdi_dir
        self.share_root = share_root
        self.kind = kind
        self.driver_root = driver_root
        self.driver = driver
        self.hook_path = hook_path

    def ensure_dir(self) -> None:
        self.cdi_dir.mkdir(mode=CDI_DIR_MODE, parents=True, exist_ok=True)

    def path_for(self, claim_uid: str) -> Path:
        """The spec path of a claim; refuses anything that would resolve outside the CDI directory."""
        root = self.cdi_dir.resolve()
        path = (root / spec_file_name(self.kind, claim_uid)).resolve()
        if path.parent != root:
            raise InvalidName(f"spec file for claim {claim_uid!r} would leave {root}")
        return path

    def render(self, allocation: ResolvedAllocation) -> dict[str, Any]:
        spec = build_spec(
            allocation,
            kind=self.kind,
            driver_root=self.driver_root,
            driver=self.driver,
            hook_path=self.hook_path,
            share_root=self.share_root,
        )
        validate_spec(spec)
        return spec

    def write(self, allocation: ResolvedAllocation, spec: dict[str, Any] | None = None) -> Path:
        """Write the claim's spec; `spec` is what `render(allocation)` returned, when the caller
        rendered it already (rendering validates, which is most of its cost)."""
        if spec is None:
            spec = self.render(allocation)
        path = self.path_for(allocation.claim.uid)
        self.ensure_dir()
        # msgspec's encoder and formatter are C; json.dumps with an indent runs in Python
        text = msgspec.json.format(msgspec.json.encode(spec), indent=2)
        atomic_write(path, text + b"\n", mode=SPEC_FILE_MODE)
        return path

    def exists(self, claim_uid: str) -> bool:
        return self.path_for(claim_uid).is_file()

    def remove(self, claim_uid: str) -> bool:
        return remove_durably(self.path_for(claim_uid))

    def claim_uids_on_disk(self) -> list[str]:
        """Uids of the claims that have a spec file of this kind in the CDI directory."""
        prefix = spec_file_prefix(self.kind)
        try:
            names = os.listdir(self.cdi_dir)
        except FileNotFoundError:
            return []
        uids: list[str] = []
        for name in sorted(names):
            if not (name.startswith(prefix) and name.endswith(".json")):
                continue
            uid = name[len(prefix) : -len(".json")]
            try:
                uids.append(validate_claim_uid(uid))
            except InvalidName:
                log.warning("ignoring CDI file %s: its claim uid is not valid", name)
        return uids

    def read(self, claim_uid: str) -> ResolvedAllocation:
        """The allocation a spec file was written for; ValueError/OSError when it cannot be read."""
        raw = self.path_for(claim_uid).read_bytes()
        spec = json.loads(raw)
        allocation = allocation_from_spec(spec, kind=self.kind)
        if allocation.claim.uid != claim_uid:
            raise ValueError(f"spec file of claim {claim_uid} names claim {allocation.claim.uid}")
        return allocation
