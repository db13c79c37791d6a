"""The Prometheus Operator's CRDs the chart's tests install: the pinned release's ServiceMonitor and
PrometheusRule, from the cache `make monitoring-crds` fills."""

from __future__ import annotations

from pathlib import Path

import pytest

from tangram.local import monitoringcrds


def test_the_cached_crds_are_the_pinned_releases_servicemonitor_and_prometheusrule() -> None:
    crds = {crd["spec"]["names"]["kind"]: crd for crd in monitoringcrds.load()}
    assert set(crds) == {"ServiceMonitor", "PrometheusRule"}
    for crd in crds.values():
        assert crd["spec"]["group"] == "monitoring.coreos.com"
        annotations = crd["metadata"]["annotations"]
        assert annotations["operator.prometheus.io/version"] == monitoringcrds.PROMETHEUS_OPERATOR_VERSION[1:]
        # the chart renders monitoring.coreos.com/v1: served, with a schema to validate against
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        assert version["served"] and version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_without_the_cache_the_error_says_how_to_fill_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(monitoringcrds.MonitoringCrdsError, match="run `make monitoring-crds`"):
        monitoringcrds.find_paths()
