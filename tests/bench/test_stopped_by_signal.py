"""A benchmark stopped by SIGTERM or SIGINT stops what it started: a control plane runs in a session
of its own, so the signal never reaches it unless the run stops it on the way out."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from tangram.bench.kubesim import BenchError, stopped_by_signal


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_cancels_the_run_and_its_own_session_child_is_stopped(signum: signal.Signals) -> None:
    children: list[asyncio.subprocess.Process] = []
    running = asyncio.Event()

    async def run() -> str:
        child = await asyncio.create_subprocess_exec("sleep", "600", start_new_session=True)
        children.append(child)
        try:
            running.set()
            await asyncio.sleep(600)
            return "finished"
        finally:
            child.terminate()
            await child.wait()

    async def signal_once_running() -> None:
        await running.wait()
        os.kill(os.getpid(), signum)

    sender = asyncio.create_task(signal_once_running())
    with pytest.raises(BenchError, match=f"stopped by {signum.name}"):
        await stopped_by_signal(run())
    await sender
    assert children[0].returncode == -signal.SIGTERM


async def test_a_run_left_alone_returns_its_result_and_the_handlers_are_removed() -> None:
    async def run() -> int:
        return 7

    assert await stopped_by_signal(run()) == 7
    loop = asyncio.get_running_loop()
    assert not loop.remove_signal_handler(signal.SIGTERM)  # none left installed
