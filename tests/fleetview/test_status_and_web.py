"""`tangram status` and `tangram ui` against a real JetStream; the web view in headless Chromium."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import aiohttp
import pytest

from tangram.bus import Bus
from tangram.local.natsserver import NatsServer
from tests.fleetview.pictures import NODE, fleet_events
from tests.support.webview import UiProcess, chromium

DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "ui.png"


async def publish_fleet(bus: Bus) -> None:
    for event in fleet_events():
        await bus.publish(event)


async def tangram(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tangram.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode(), err.decode()


async def test_status_reads_the_fleet_from_the_bus(bus: Bus, nats_server: NatsServer) -> None:
    await publish_fleet(bus)
    code, out, err = await tangram("status", "--nats-url", nats_server.url, "--json")
    assert code == 0, err
    status = json.loads(out)
    [node] = status["nodes"]
    assert node["name"] == NODE and len(node["gpus"]) == 8
    gpu0 = node["gpus"][0]
    assert [(i["profile"], i["start"], i["claim"], i["warm"]) for i in gpu0["instances"]] == [
        ("1g.18gb", 0, "ml/embedder", False),
        ("1g.18gb", 2, None, True),
        ("3g.71gb", 4, "ml/reranker", False),
    ]
    assert [g["whole_claim"] for g in node["gpus"][1:4]] == ["ml/llm", "ml/llm", None]
    assert status["counts"]["ready"] == 2 and status["counts"]["failed"] == 1
    # Nothing holds the allocator lease on this bus: said plainly.
    assert status["services"][0] == {
        "name": "allocator",
        "state": "down",
        "detail": "no leader holds the allocator lease",
    }
    code, out, err = await tangram("status", "--nats-url", nats_server.url)
    assert code == 0, err
    assert "[1g.18gb ]" in out and "embedder" in out and "whole GPU held by ml/llm" in out


async def test_status_names_an_unreachable_bus() -> None:
    code, _, err = await tangram("status", "--nats-url", "nats://127.0.0.1:1")
    assert code == 2 and "cannot connect to NATS at nats://127.0.0.1:1" in err


class FleetUi(UiProcess):
    async def until_shown(self, session: aiohttp.ClientSession, claims: int) -> dict[str, object]:
        """The fleet as served, once the follower has folded what the bus holds."""
        for _ in range(200):
            async with session.get(self.url + "api/fleet") as response:
                fleet = await response.json()
            if fleet["nodes"] and len(fleet["claims"]) == claims:
                return dict(fleet)
            await asyncio.sleep(0.05)
        raise AssertionError(f"the ui did not show the fleet: {fleet}")


async def test_the_web_view_is_read_only_and_loopback(bus: Bus, nats_server: NatsServer) -> None:
    await publish_fleet(bus)
    async with FleetUi(nats_server.url) as ui, aiohttp.ClientSession() as session:
        await ui.until_shown(session, claims=4)
        for path in ("", "api/fleet", "api/stream", "no-such-page"):
            for method in ("POST", "PUT", "DELETE", "PATCH"):
                async with session.request(method, ui.url + path) as response:
                    assert response.status == 405, (method, path)
                    assert response.headers["Allow"] == "GET,HEAD"
        async with session.get(ui.url) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/html")


async def test_the_web_view_follows_the_bus_live(bus: Bus, nats_server: NatsServer) -> None:
    events = fleet_events()
    inventory, claims = events[0], events[1:]
    await bus.publish(inventory)
    async with FleetUi(nats_server.url) as ui, aiohttp.ClientSession() as session:
        async with session.get(ui.url + "api/stream") as stream:
            pictures = _data(stream)
            # The follower folds the stored inventory, then pushes: wait for the node to show.
            async for picture in pictures:
                if picture["nodes"]:
                    break
            assert picture["claims"] == []
            for event in claims:
                await bus.publish(event)
            async for picture in pictures:
                if len(picture["claims"]) == 4:
                    break
        assert {c["claim"]: c["state"] for c in picture["claims"]} == {
            "ml/embedder": "ready",
            "ml/llm": "ready",
            "ml/reranker": "allocated",
            "ml/too-big": "failed",
        }


async def _data(response: aiohttp.ClientResponse):  # type: ignore[no-untyped-def]
    async for raw in response.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            yield json.loads(line[len("data: ") :])


@pytest.mark.timeout(240)
async def test_the_web_view_in_headless_chromium(bus: Bus, nats_server: NatsServer, tmp_path: Path) -> None:
    await publish_fleet(bus)
    async with FleetUi(nats_server.url) as ui, aiohttp.ClientSession() as session:
        await ui.until_shown(session, claims=4)
        dom = await asyncio.to_thread(chromium, "--dump-dom", ui.url)
        assert dom.returncode == 0, dom.stderr[-2000:]
        page = dom.stdout
        # Drawn by the page's script, not by the server: the template has none of these.
        assert f'data-node="{NODE}"' in page and 'data-gpus="8"' in page
        assert page.count('data-gpu="GPU-') == 8
        assert "<span>1g.18gb</span><span>embedder</span>" in page
        assert "<span>3g.71gb</span><span>reranker</span>" in page
        assert "<span>1g.18gb</span><span>warm</span>" in page
        assert "whole GPU · ml/llm" in page
        assert "NVLink: 28 pairs" in page
        assert '<tr data-claim="ml/too-big">' in page and "state-failed" in page
        shot = tmp_path / "ui.png"
        taken = await asyncio.to_thread(chromium, f"--screenshot={shot}", "--window-size=1280,900", ui.url)
        assert taken.returncode == 0, taken.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    if os.environ.get("TANGRAM_UPDATE_SCREENSHOT") == "1":
        DOCS_SCREENSHOT.write_bytes(png)


async def test_the_ui_service_serves_the_view_and_says_it_is_ready(bus: Bus, nats_server: NatsServer) -> None:
    """What docker-compose runs: `python -m services.ui`, with health endpoints like every service."""
    await publish_fleet(bus)
    env = dict(os.environ, TANGRAM_NATS_URL=nats_server.url, TANGRAM_UI_LISTEN="127.0.0.1:0")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.ui",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    try:
        health = url = ""
        while not (health and url):
            line = json.loads(await asyncio.wait_for(process.stdout.readline(), 30))
            health = health or (f"http://127.0.0.1:{line['health_port']}/" if "health_port" in line else "")
            url = url or line.get("url", "")
        async with aiohttp.ClientSession() as session:
            async with session.get(health + "readyz") as response:
                assert response.status == 200
            async with session.get(url) as response:
                assert response.status == 200 and "<title>Tangram fleet</title>" in await response.text()
            async with session.post(url + "api/fleet") as response:
                assert response.status == 405
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 20)
    assert process.returncode == 0


def test_the_view_binds_to_loopback_unless_told() -> None:
    from tangram.fleetview.web import DEFAULT_LISTEN, parse_listen

    assert parse_listen(DEFAULT_LISTEN) == ("127.0.0.1", 8484)
    assert parse_listen("[::1]:9000") == ("::1", 9000)
    with pytest.raises(ValueError, match="listen address '8484' is not HOST:PORT"):
        parse_listen("8484")
