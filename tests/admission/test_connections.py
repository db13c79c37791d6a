"""The bounds on the webhook's connections, over real sockets and real TLS on 127.0.0.1: what the
server does to clients that never handshake, idle, stall or crowd it, and what idle connections
cost the webhook's process.

The bounds are set to a fraction of a second here, and every test waits for the server to close
the connection (an end of file) for at most CLOSE_WAIT_S, far longer than any bound it sets and far
shorter than the defaults of asyncio (60 s handshakes) and aiohttp (3,630 s keep-alive): nothing is
asserted on how long it took.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from services.admission.certs import TlsMaterial, issue
from services.admission.connections import ConnectionBounds
from services.admission.server import AdmissionServer, server_tls
from tests.admission.reviews import StubLookup, review
from tests.support.polling import until

CLOSE_WAIT_S = 10.0
SHORT = 0.2  # seconds: a bound under test
LONG = 60.0  # seconds: a bound out of the way

REVIEW = json.dumps(review()).encode()  # a pod without claims: answered without a look-up


def request(*, close: bool = False) -> bytes:
    """A review as the API server sends it, on a keep-alive connection unless `close`."""
    close_header = "Connection: close\r\n" if close else ""
    head = (
        "POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(REVIEW)}\r\n{close_header}\r\n"
    )
    return head.encode() + REVIEW


REQUEST = request()


@pytest.fixture
def material() -> TlsMaterial:
    return issue(("127.0.0.1",), datetime.now(UTC))


@asynccontextmanager
async def serving(
    tmp_path: Path, material: TlsMaterial, **bounds: float
) -> AsyncIterator[tuple[AdmissionServer, ssl.SSLContext]]:
    server = AdmissionServer(StubLookup(), bounds=ConnectionBounds(**bounds))  # type: ignore[arg-type]
    await server.start("127.0.0.1", 0, server_tls(tmp_path / "tls", material))
    try:
        yield server, ssl.create_default_context(cadata=material.ca_bundle.decode())
    finally:
        await server.stop()


@asynccontextmanager
async def connected(
    port: int, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    try:
        yield reader, writer
    finally:
        writer.close()
        with suppress(OSError):
            await writer.wait_closed()


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before it closed the connection; TimeoutError if it did not close it
    within CLOSE_WAIT_S."""
    try:
        return await asyncio.wait_for(reader.read(), CLOSE_WAIT_S)
    except ConnectionResetError:
        return b""  # closed with bytes of ours unread: a reset rather than an end of file


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """The status and headers of one HTTP answer (its body read and dropped)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLOSE_WAIT_S)
    status_line, *lines = head.decode().strip().split("\r\n")
    headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)}
    await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers


def closed_by(bound: str) -> float:
    return REGISTRY.get_sample_value("tangram_admission_connections_closed_total", {"bound": bound}) or 0.0


@pytest.mark.parametrize(
    "sent",
    [b"", b"\x16\x03\x01\x02\x00\x01"],  # nothing; the first bytes of a ClientHello, then nothing
    ids=["silent", "stalled-hello"],
)
async def test_a_connection_that_does_not_complete_its_handshake_is_closed(
    tmp_path: Path, material: TlsMaterial, sent: bytes
) -> None:
    before = closed_by("handshake")
    async with (
        serving(tmp_path, material, handshake_timeout_s=SHORT) as (server, _),
        connected(server.port) as (reader, writer),
    ):
        writer.write(sent)
        assert await until_closed(reader) == b""
        await until("no connection left open", lambda: server.open_connections == 0, CLOSE_WAIT_S, every=0.01)
    assert closed_by("handshake") == before + 1


async def test_a_keep_alive_connection_idle_past_the_idle_timeout_is_closed(
    tmp_path: Path, material: TlsMaterial
) -> None:
    async with (
        serving(tmp_path, material, idle_timeout_s=SHORT) as (server, tls),
        connected(server.port, tls) as (reader, writer),
    ):
        writer.write(REQUEST)
        status, headers = await answer(reader)
        assert status == 200 and headers.get("connection", "keep-alive").lower() == "keep-alive"
        assert await until_closed(reader) == b""


async def test_a_request_head_that_stalls_is_closed(tmp_path: Path, material: TlsMaterial) -> None:
    async with (
        serving(tmp_path, material, idle_timeout_s=SHORT) as (server, tls),
        connected(server.port, tls) as (reader, writer),
    ):
        writer.write(REQUEST[: REQUEST.index(b"Content-Length")])
        assert await until_closed(reader) == b""


async def test_a_body_that_stalls_gets_408_and_its_connection_is_closed(
    tmp_path: Path, material: TlsMaterial
) -> None:
    before = closed_by("body")
    async with (
        serving(tmp_path, material, body_timeout_s=SHORT) as (server, tls),
        connected(server.port, tls) as (reader, writer),
    ):
        writer.write(REQUEST[: -len(REVIEW) // 2])
        status, _ = await answer(reader)
        assert status == 408
        assert await until_closed(reader) == b""
    assert closed_by("body") == before + 1


async def test_connections_beyond_the_limit_are_closed_at_once_until_one_of_those_open_closes(
    tmp_path: Path, material: TlsMaterial
) -> None:
    before = closed_by("limit")
    async with serving(
        tmp_path, material, max_connections=5, handshake_timeout_s=LONG, idle_timeout_s=LONG
    ) as (server, tls):
        opened = [await asyncio.open_connection("127.0.0.1", server.port, ssl=tls) for _ in range(5)]
        try:
            assert server.open_connections == 5
            # refused before any handshake: a refusal by the (long) handshake timeout would not come
            # within CLOSE_WAIT_S
            with pytest.raises(OSError):
                await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", server.port, ssl=tls), CLOSE_WAIT_S
                )
            assert closed_by("limit") == before + 1
            assert server.open_connections == 5
            # the five still work
            reader, writer = opened[0]
            writer.write(REQUEST)
            assert (await answer(reader))[0] == 200

            opened.pop()[1].close()
            await until(
                "four connections open", lambda: server.open_connections == 4, CLOSE_WAIT_S, every=0.01
            )
            async with connected(server.port, tls) as (reader, writer):
                writer.write(REQUEST)
                assert (await answer(reader))[0] == 200
        finally:
            for _, writer in opened:
                writer.close()


IDLE = 1000
GROWTH_BOUND_MB = 30  # ~30 KB a connection; asyncio's TLS server spent ~300 KB on each


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for process {pid}")


def open_idle(port: int, count: int) -> list[socket.socket]:
    """`count` connections to `port` that send nothing, opened as fast as the kernel can (all must
    be open before the handshake timeout closes the first)."""
    connections: list[socket.socket] = []
    try:
        for _ in range(count):
            connections.append(socket.create_connection(("127.0.0.1", port)))
            connections[-1].setblocking(False)
    except BaseException:
        for connection in connections:
            connection.close()
        raise
    return connections


def is_closed(connection: socket.socket) -> bool:
    """Whether the server closed `connection` already (it never sends on an idle one)."""
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


async def until_closed_raw(connection: socket.socket) -> bytes:
    """`until_closed` for a plain socket."""
    loop = asyncio.get_running_loop()
    try:
        return await asyncio.wait_for(loop.sock_recv(connection, 1), CLOSE_WAIT_S)
    except ConnectionResetError:
        return b""


def reset_peak(pid: int) -> None:
    """Resets the process's peak RSS (VmHWM) to its RSS now, where the kernel lets this process;
    elsewhere the peak since its start stays (no higher than its baseline but for a start-up burst)."""
    with suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(port: int) -> Samples:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as got:
        text = await got.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


OPEN = ("tangram_admission_connections", ())
HANDSHAKE_CLOSED = ("tangram_admission_connections_closed_total", (("bound", "handshake"),))


@pytest.fixture
def enough_file_descriptors() -> Iterator[None]:
    """The soft limit on open files raised for this process and the server it starts (each holds
    one end of every connection), and restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = IDLE + 200
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"{IDLE} connections need {needed} open files; the hard limit is {hard}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.usefixtures("enough_file_descriptors")
async def test_a_thousand_idle_connections_cost_little_and_are_all_closed_by_the_handshake_timeout(
    tmp_path: Path,
) -> None:
    ca_file = tmp_path / "ca.pem"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.admission.webhook_process",
        str(ca_file),
        # long enough to open all of them before the first is closed, short to keep the test short
        "--handshake-timeout=3",
        f"--max-connections={IDLE}",
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    idle: list[socket.socket] = []
    try:
        ports = await asyncio.wait_for(process.stdout.readline(), 30)
        assert ports, "the webhook exited before serving"
        port, metrics_port = map(int, ports.split())
        # one review first, so that what serving costs once is in the baseline
        tls = ssl.create_default_context(cafile=str(ca_file))
        async with connected(port, tls) as (reader, writer):
            writer.write(request(close=True))
            assert (await answer(reader))[0] == 200
        async with asyncio.timeout(CLOSE_WAIT_S):
            while (await scrape(metrics_port))[OPEN] != 0:
                await asyncio.sleep(0.01)
        baseline = status_kb(process.pid, "VmRSS")
        reset_peak(process.pid)

        idle = open_idle(port, IDLE)
        assert not any(is_closed(connection) for connection in idle), "some closed before all were open"
        closed = await asyncio.gather(*(until_closed_raw(connection) for connection in idle))

        peak, after = status_kb(process.pid, "VmHWM"), status_kb(process.pid, "VmRSS")
        metrics = await scrape(metrics_port)
    finally:
        for connection in idle:
            connection.close()
        if process.returncode is None:
            process.terminate()
            await asyncio.wait_for(process.wait(), 30)
    assert closed == [b""] * IDLE  # every one closed by the server, none answered
    assert metrics[HANDSHAKE_CLOSED] == IDLE
    assert metrics[OPEN] == 0
    print(f"webhook RSS: {baseline} KB, {peak} KB at most with {IDLE} idle connections, {after} KB after")
    assert (peak - baseline) / 1024 < GROWTH_BOUND_MB, f"{IDLE} idle connections: {baseline} -> {peak} KB"
    assert (after - baseline) / 1024 < GROWTH_BOUND_MB, f"after they closed: {baseline} -> {after} KB"
