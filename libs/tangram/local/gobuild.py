"""The one Go build cache: tools Tangram builds from Go modules (the control plane, Helm) live under
`~/.cache/tangram/<tool>/` (or `$XDG_CACHE_HOME`), one folder per version and inputs, built once;
files taken from a Go module's source (the Prometheus Operator's CRDs) are kept there the same way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
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
        result = _go(
            go_args(staging),
            error=error,
            cwd=cwd or staging,
            env={**(env or {}), "GOBIN": str(staging)},
        )
        built = staging / path.name
        if result.returncode != 0 or not built.exists():
            raise error(f"the build of {what} failed with exit status {result.returncode}")
        built.replace(path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"built in {time.monotonic() - started:.0f}s: {path}", file=out, flush=True)
    return path


def module_dir(module: str, version: str, *, error: type[Exception], work: Path) -> Path:
    """The source of `module@version` in Go's module cache, downloaded there (and checked against
    the checksum database) unless it is there already: `go mod download`. The folder is Go's and
    read-only; `work` is the working directory, outside any Go module so none of its
    requirements is consulted."""
    work.mkdir(parents=True, exist_ok=True)
    result = _go(["mod", "download", "-json", f"{module}@{version}"], error=error, cwd=work, capture=True)
    try:
        answer = json.loads(result.stdout)
    except json.JSONDecodeError:
        answer = {}
    if result.returncode != 0 or not answer.get("Dir"):
        why = answer.get("Error") or result.stderr.strip() or f"exit status {result.returncode}"
        raise error(f"go mod download {module}@{version} failed: {why}")
    return Path(answer["Dir"])


def _go(
    args: Sequence[str],
    *,
    error: type[Exception],
    cwd: Path,
    env: Mapping[str, str] | None = None,
    capture: bool = False,
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["go", *args],
            cwd=cwd,
            env={**os.environ, **(env or {})},
            capture_output=capture,
            text=True,
            check=False,
        )
    except FileNotFoundError as exc:
        raise error(f"cannot run the Go toolchain (Go 1.26+ is needed): {exc}") from exc


def tool_main(
    argv: Sequence[str] | None,
    *,
    prog: str,
    commands: Mapping[str, Callable[[], Iterable[object]]],
    errors: tuple[type[Exception], ...],
) -> int:
    """`python -m <prog> COMMAND` of a cached tool: runs the one command named and prints each
    path it gives; 2 on any other command line, 1 with the message of a failure in `errors`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] not in commands:
        print(f"usage: python -m {prog} {'|'.join(commands)}", file=sys.stderr)
        return 2
    try:
        for path in commands[args[0]]():
            print(path)
    except errors as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0
