"""`python -m tangram.nvml.sim.mpscontrol [-d | -f]`, as `nvidia-cuda-mps-control [-d | -f]`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tangram.nvml.sim.mpscontrol import DEFAULT_LOG_DIRECTORY, DEFAULT_PIPE_DIRECTORY, client, daemon

USAGE = "usage: python -m tangram.nvml.sim.mpscontrol [-d | -f]  (commands on stdin without options)"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    pipe_dir = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIRECTORY).absolute()
    log_dir = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIRECTORY).absolute()
    if args in (["-d"], ["-f"]):
        return daemon.start(pipe_dir, log_dir, foreground=args == ["-f"])
    if not args:
        return client.run(pipe_dir, sys.stdin, sys.stdout)
    print(USAGE, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
