"""`tangram bench bus`: Tangram's bus and plain nats-py on the same servers in the same run, on one
server or on a 3-server cluster whose streams the servers report replicated three times."""

from __future__ import annotations

import pytest

from tangram.bench.bus import _run


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("cluster", "servers"), [(False, 1), (True, 3)])
async def test_the_bus_bench_measures_both_on_the_same_servers(cluster: bool, servers: int) -> None:
    report = await _run(400, 400, cluster=cluster)
    assert report["servers"] == servers
    assert report["stream_replicas"] == {"TANGRAM_CLAIMS": servers, "BENCH_PLAIN_SATURATED": servers}
    saturated = report["saturated"]
    for side in ("tangram", "nats_py"):
        assert all(value > 0 for value in saturated[side].values()), saturated[side]
    for key, ratio in saturated["ratio"].items():
        assert ratio == round(saturated["tangram"][key] / saturated["nats_py"][key], 3)
    assert report["paced"]["events"] == 400
