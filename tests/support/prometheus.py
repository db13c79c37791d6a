"""A real Prometheus (Debian's package) for the telemetry tests: started on a free loopback port
with a temporary store, scraping the given targets every second and evaluating the given rule
files every second, queried through its HTTP API."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tangram.local.natsserver import free_port
from tests.support.polling import until


class Prometheus:
    def __init__(self, jobs: Mapping[str, Sequence[str]], rule_files: Sequence[Path] = ()) -> None:
        binary = shutil.which("prometheus")
        assert binary is not None, "prometheus missing: `make prometheus` installs Debian's package"
        self._dir = Path(tempfile.mkdtemp(prefix="tgm-prometheus-"))
        self.port = free_port()
        config = {
            # a scrape may take the whole interval on a loaded machine before it counts as failed
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(targets)}]}
                for job, targets in jobs.items()
            ],
        }
        (self._dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._log = (self._dir / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={self._dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self._dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return (self._dir / "prometheus.log").read_text(errors="replace")[-4000:]

    async def ready(self) -> None:
        async def answers() -> bool:
            try:
                async with aiohttp.ClientSession() as session, session.get(f"{self.url}/-/ready") as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await until("Prometheus ready", answers, process=self.process)

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now; AssertionError with Prometheus's reason when
        the query is refused."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{self.url}/api/v1/query", params={"query": expr}) as response,
        ):
            body = await response.json()
        assert body.get("status") == "success", f"{expr}: {body}"
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    async def targets_up(self) -> dict[str, str]:
        """scrape url -> health of every active target."""
        async with aiohttp.ClientSession() as session, session.get(f"{self.url}/api/v1/targets") as response:
            body = await response.json()
        return {t["scrapeUrl"]: t["health"] for t in body["data"]["activeTargets"]}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)
