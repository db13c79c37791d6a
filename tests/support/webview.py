"""The web view as a user meets it: `tangram ui` run as a process, and pages read and pictured by
headless Chromium (Debian's package, which `make test` installs)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile


class UiProcess:
    def __init__(self, nats_url: str, *extra: str) -> None:
        self.nats_url = nats_url
        self.extra = extra
        self.process: asyncio.subprocess.Process | None = None
        self.url = ""

    async def __aenter__(self) -> UiProcess:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tangram.cli",
            "ui",
            "--listen",
            "127.0.0.1:0",
            "--nats-url",
            self.nats_url,
            *self.extra,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert self.process.stdout is not None
        line = (await asyncio.wait_for(self.process.stdout.readline(), 30)).decode()
        assert line.startswith("tangram ui: serving http://127.0.0.1:"), line
        self.url = line.split("serving ", 1)[1].strip()
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.process is not None
        self.process.terminate()
        await asyncio.wait_for(self.process.wait(), 20)
        assert self.process.returncode == 0


def chromium(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium")
    assert binary is not None, "chromium is missing: `make test` installs it (apt-get install chromium)"
    with tempfile.TemporaryDirectory(prefix="tangram-chromium-") as profile:
        return subprocess.run(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                f"--user-data-dir={profile}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
