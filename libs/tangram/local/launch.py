"""Ending a process Tangram started locally (nats-server, the control plane): the one way."""

from __future__ import annotations

import contextlib
import subprocess
import threading
from typing import IO, Any


def end_process(
    process: subprocess.Popen[Any],
    *,
    timeout: float,
    reader: threading.Thread | None = None,
    pipe: IO[Any] | None = None,
) -> None:
    """Graceful stop (SIGTERM), SIGKILL if it does not exit within `timeout`; then join the thread
    reading its output (it ends at EOF once the process is gone) and close that pipe, so nothing
    reads a closed pipe."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if reader is not None:
        reader.join(timeout)
    if pipe is not None:
        with contextlib.suppress(OSError):
            pipe.close()
