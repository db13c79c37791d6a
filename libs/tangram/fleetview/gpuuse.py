"""`tangram ui --prometheus-url`: per-pod GPU use, from the same recorded series the Grafana
dashboard's panels query (deploy/helm/tangram/files/prometheus/tangram.rules.yaml), rendered on
the server as one page (no script: what is shown is what Prometheus said when it was asked).

Label values come from the cluster (pod and namespace names) and are escaped like any text.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from string import Template
from typing import Any
from urllib.parse import urlsplit

import aiohttp

# what the page shows -> the dashboard panel's query it shares
QUERIES = {
    "engine": "pod:tangram_gpu_engine_active:ratio",
    "memory": "pod:tangram_gpu_memory_used:bytes",
    "utilization": "pod:tangram_gpu_utilization:percent",
    "power": "pod:tangram_gpu_power:watts",
    "namespaces": "namespace:tangram_gpu_engine_active:sum",
}
QUERY_TIMEOUT_S = 5.0


class PrometheusError(RuntimeError):
    """Prometheus could not be asked, or refused a query; the message says which and why."""


def checked_url(text: str) -> str:
    """An http(s) URL without credentials or a query: the base of Prometheus's HTTP API."""
    parts = urlsplit(text)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"--prometheus-url {text!r} is not an http(s) URL")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError(f"--prometheus-url {text!r} must name no credentials, query or fragment")
    return text.rstrip("/")


@dataclass
class PodDevice:
    namespace: str
    pod: str
    device: str
    node: str
    profile: str = ""
    engine: float | None = None  # 0-1
    memory_bytes: float | None = None
    utilization: float | None = None  # percent, whole GPUs only
    power_w: float | None = None  # whole GPUs only


@dataclass
class GpuUse:
    devices: list[PodDevice] = field(default_factory=list)
    namespaces: dict[str, float] = field(default_factory=dict)  # namespace -> GPUs' worth busy


def gpu_use(results: Mapping[str, list[dict[str, Any]]]) -> GpuUse:
    """The rows the page shows, from each query's instant vector (pure)."""
    rows: dict[tuple[str, str, str], PodDevice] = {}
    for name, attribute in (
        ("engine", "engine"),
        ("memory", "memory_bytes"),
        ("utilization", "utilization"),
        ("power", "power_w"),
    ):
        for sample in results.get(name, []):
            labels = sample.get("metric", {})
            key = (labels.get("namespace", ""), labels.get("pod", ""), labels.get("device", ""))
            row = rows.setdefault(
                key,
                PodDevice(
                    namespace=key[0],
                    pod=key[1],
                    device=key[2],
                    node=labels.get("node", ""),
                    profile=labels.get("profile", ""),
                ),
            )
            setattr(row, attribute, float(sample["value"][1]))
    namespaces = {
        s.get("metric", {}).get("namespace", ""): float(s["value"][1]) for s in results.get("namespaces", [])
    }
    devices = sorted(rows.values(), key=lambda r: (r.namespace, r.pod, r.device))
    return GpuUse(devices=devices, namespaces=dict(sorted(namespaces.items())))


async def read_gpu_use(base_url: str) -> GpuUse:
    timeout = aiohttp.ClientTimeout(total=QUERY_TIMEOUT_S)
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for name, expr in QUERIES.items():
                async with session.get(f"{base_url}/api/v1/query", params={"query": expr}) as response:
                    body = await response.json(content_type=None)
                if not isinstance(body, dict) or body.get("status") != "success":
                    why = body.get("error", "no answer") if isinstance(body, dict) else "not JSON"
                    raise PrometheusError(f"Prometheus refused {expr}: {why}")
                results[name] = list(body.get("data", {}).get("result", []))
    except (aiohttp.ClientError, TimeoutError, ValueError) as error:
        raise PrometheusError(
            f"Prometheus at {base_url} cannot be asked: {error or type(error).__name__}"
        ) from None
    return gpu_use(results)


def _bar(ratio: float | None) -> str:
    if ratio is None:
        return '<td class="none">-</td>'
    width = max(0.0, min(ratio, 1.0)) * 100
    return f'<td><div class="bar"><div style="width:{width:.0f}%"></div></div>{ratio * 100:.0f}%</td>'


def _number(value: float | None, unit: str, scale: float = 1.0) -> str:
    return '<td class="none">-</td>' if value is None else f"<td>{value / scale:,.1f} {unit}</td>"


def render(use: GpuUse, prometheus_url: str, error: str = "") -> str:
    e = html.escape
    rows = "".join(
        f'<tr data-pod="{e(r.namespace)}/{e(r.pod)}"><td>{e(r.namespace)}</td><td>{e(r.pod)}</td>'
        f"<td>{e(r.device)}{' · ' + e(r.profile) if r.profile else ''}</td><td>{e(r.node)}</td>"
        f"{_bar(r.engine)}{_number(r.utilization, '%')}{_number(r.memory_bytes, 'GiB', 2**30)}"
        f"{_number(r.power_w, 'W')}</tr>"
        for r in use.devices
    )
    namespaces = "".join(
        f'<tr data-namespace="{e(ns)}"><td>{e(ns)}</td><td>{busy:.2f}</td></tr>'
        for ns, busy in use.namespaces.items()
    )
    problem = f'<p class="error">{e(error)}</p>' if error else ""
    empty = "" if use.devices or error else "<p>No pod holds a prepared GPU or MIG device now.</p>"
    page = resources.files("tangram.fleetview").joinpath("gpuuse.html").read_text()
    return Template(page).substitute(
        source=e(prometheus_url), problem=problem, empty=empty, rows=rows, namespaces=namespaces
    )
