"""The one Go build cache: tools Tangram builds from Go modules (the control plane, Helm) live under
`~/.cache/tangram/<tool>/` (or `$XDG_CACHE_HOME`), one folder per version and inputs, built once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


def cache_root(tool: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tangram" / tool


def build_once(
    path: Path,
    go_args: Callable[[Path], Sequence[str]],
    *,
    what: str,
    hint: str,
    error: type[Exception],
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    out: Any = sys.stderr,
) -> Path:
    """`path`, built by `go <go_args(staging)>` unless it is there already.

    The command writes the binary, named as `path`, into a private staging folder (also its GOBIN,
    for `go install`) that is renamed into place: a concurrent or interrupted build never leaves a
    half-written binary where a test looks. The staging folder is the working directory unless
    `cwd` is given.
    """
    if path.exists():
        return path
    print(f"building {what} into {path.parent}", file=out)
    print(f"this takes {hint}; later runs reuse it", file=out, flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".build-{os.getpid()}"
    staging.mkdir(exist_ok=True)
    started = time.monotonic()
    try:
        try:
            result = subprocess.run(
                ["go", *go_args(staging)],
                cwd=cwd or staging,
                env={**os.environ, **(env or {}), "GOBIN": str(staging)},
                check=False,
            )
        except FileNotFoundError as exc:
            raise error(f"cannot run the Go toolchain (Go 1.26+ is needed): {exc}") from exc
        built = staging / path.name
        if result.returncode != 0 or not built.exists():
            raise error(f"the build of {what} failed with exit status {result.returncode}")
        built.replace(path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"built in {time.monotonic() - started:.0f}s: {path}", file=out, flush=True)
    return path
