"""SIGTERM while a service is still reaching NATS stops it at once, cleanly."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: nothing listens there


async def test_sigterm_before_nats_is_reached_stops_the_service_with_exit_0() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.allocator",
        "--nats-url",
        f"nats://127.0.0.1:{unused_port()}",
        "--health-port",
        "0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    messages: list[str] = []
    try:
        while "service starting" not in messages:
            line = await asyncio.wait_for(process.stdout.readline(), 30)
            assert line, f"the service exited before starting: {messages}"
            messages.append(json.loads(line)["message"])
        process.send_signal(signal.SIGTERM)
        rest = await asyncio.wait_for(process.stdout.read(), 10)
        code = await asyncio.wait_for(process.wait(), 10)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    messages += [json.loads(line)["message"] for line in rest.decode().splitlines() if line.startswith("{")]
    assert code == 0, messages
    assert "stopped while starting" in messages
