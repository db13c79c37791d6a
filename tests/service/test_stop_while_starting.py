"""SIGTERM while a service is still reaching NATS stops it at once, cleanly."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys

import pytest

from tangram.service import reached


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


async def test_a_milestone_not_reached_when_the_service_stops_first() -> None:
    """A service told to stop while it waits for a milestone its stopped tasks will never reach
    (the allocator waiting for its claim bridge to sync) stops instead of waiting for ever."""
    milestone, stop = asyncio.Event(), asyncio.Event()

    async def background() -> None:
        await stop.wait()  # ends on stop, without setting the milestone

    task = asyncio.create_task(background())
    waiting = asyncio.create_task(reached(milestone, stop, [task]))
    await asyncio.sleep(0)
    stop.set()
    assert await asyncio.wait_for(waiting, 5) is False
    await task
    milestone.set()
    assert await reached(milestone, asyncio.Event(), []) is True


async def test_a_failed_task_is_raised_while_waiting_for_a_milestone() -> None:
    async def failing() -> None:
        raise RuntimeError("the claims watch failed")

    task = asyncio.create_task(failing())
    with pytest.raises(RuntimeError, match="the claims watch failed"):
        await reached(asyncio.Event(), asyncio.Event(), [task])
