"""The webhook's HTTPS server and its metrics, alone in a process, for tests that measure the process:

    python -m tests.admission.webhook_process CA_FILE [--handshake-timeout S] [--max-connections N]

Serves a fresh certificate for 127.0.0.1 (its CA written to CA_FILE), prints "<https port>
<metrics port>" once serving, and stops on SIGTERM. Its reviews never need a claim look-up.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from services.admission.certs import TlsMaterial, issue
from services.admission.connections import ConnectionBounds
from services.admission.lookup import Verdict
from services.admission.review import Source
from services.admission.server import AdmissionServer, server_tls
from tangram.service.health import HealthServer


class NoLookups:
    async def verdict(self, namespace: str, references: list[tuple[Source, str]]) -> Verdict:
        raise AssertionError("this process serves reviews without Tangram claims only")


async def serve(material: TlsMaterial, bounds: ConnectionBounds) -> None:
    server = AdmissionServer(NoLookups(), bounds=bounds)  # type: ignore[arg-type]
    health = HealthServer("127.0.0.1", 0, lambda: True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    with tempfile.TemporaryDirectory(prefix="tangram-admission-test-") as work:
        await health.start()
        await server.start("127.0.0.1", 0, server_tls(Path(work), material))
        try:
            print(server.port, health.port, flush=True)
            await stop.wait()
        finally:
            await server.stop()
            await health.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ca_file", type=Path)
    parser.add_argument("--handshake-timeout", type=float, default=ConnectionBounds.handshake_timeout_s)
    parser.add_argument("--max-connections", type=int, default=ConnectionBounds.max_connections)
    args = parser.parse_args()
    bounds = ConnectionBounds(
        handshake_timeout_s=args.handshake_timeout, max_connections=args.max_connections
    )
    material = issue(("127.0.0.1",), datetime.now(UTC))
    args.ca_file.write_bytes(material.ca_bundle)
    asyncio.run(serve(material, bounds))


if __name__ == "__main__":
    main()
