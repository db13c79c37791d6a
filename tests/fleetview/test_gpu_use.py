"""The GPU-use page of `tangram ui --prometheus-url`: the dashboard's own queries, rows merged per
pod and device, label values escaped, and an unreachable Prometheus said so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tangram.fleetview.gpuuse import QUERIES, PrometheusError, checked_url, gpu_use, read_gpu_use, render

DASHBOARD = (
    Path(__file__).resolve().parents[2]
    / "deploy"
    / "helm"
    / "tangram"
    / "files"
    / "dashboards"
    / "tangram.json"
)


def sample(value: float, **labels: str) -> dict[str, object]:
    return {"metric": labels, "value": [1.0, str(value)]}


def test_the_page_asks_what_the_dashboard_panels_ask() -> None:
    exprs = {t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]}
    assert set(QUERIES.values()) <= exprs


def test_rows_are_merged_per_pod_and_device() -> None:
    mig = {"namespace": "web", "pod": "infer", "device": "gpu-2-mig", "node": "n1", "profile": "1g.18gb"}
    whole = {"namespace": "ml", "pod": "train", "device": "gpu-1", "node": "n1"}
    use = gpu_use(
        {
            "engine": [sample(0.7, **mig), sample(0.3, **whole)],
            "memory": [sample(2**30, **mig)],
            "utilization": [sample(30, **whole)],
            "power": [sample(250, **whole)],
            "namespaces": [sample(0.7, namespace="web"), sample(0.3, namespace="ml")],
        }
    )
    assert [
        (d.namespace, d.pod, d.engine, d.memory_bytes, d.utilization, d.power_w) for d in use.devices
    ] == [
        ("ml", "train", 0.3, None, 30.0, 250.0),
        ("web", "infer", 0.7, 2**30, None, None),
    ]
    assert use.devices[1].profile == "1g.18gb" and use.namespaces == {"ml": 0.3, "web": 0.7}


def test_label_values_are_escaped() -> None:
    hostile = {"namespace": "ml", "pod": '<script>alert("x")</script>', "device": "gpu-1", "node": "n1"}
    page = render(gpu_use({"engine": [sample(0.5, **hostile)]}), "http://prometheus:9090")
    assert "<script>" not in page and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page


@pytest.mark.parametrize(
    "url",
    ["ftp://prometheus:9090", "prometheus:9090", "http://user:secret@prometheus:9090", "http://p:9090/?q=1"],
)
def test_a_prometheus_url_that_is_no_plain_http_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="--prometheus-url"):
        checked_url(url)
    assert checked_url("https://prometheus.monitoring:9090/") == "https://prometheus.monitoring:9090"


async def test_an_unreachable_prometheus_is_named_in_the_error() -> None:
    with pytest.raises(PrometheusError, match=r"Prometheus at http://127.0.0.1:9 cannot be asked"):
        await read_gpu_use("http://127.0.0.1:9")
