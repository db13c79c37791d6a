"""The layout a server's version points to first (the dry-run probe confirms it: test_real_slices)."""

import pytest

from tangram.kubernetes.api.layout import LayoutError, layout_for_server, probe_slices


@pytest.mark.parametrize(
    ("major", "minor", "layout"),
    [
        ("1", "34", "1.34"),
        ("1", "35", "1.35"),
        ("1", "36", "1.36"),
        ("1", "37+", "1.37"),
        ("1", "38", "1.37"),
        ("1", "34+", "1.34"),
    ],
)
def test_a_server_version_points_to_its_layout(major: str, minor: str, layout: str) -> None:
    assert layout_for_server(major, minor) == layout


@pytest.mark.parametrize(
    ("major", "minor", "message"), [("1", "33", "needs 1.34"), ("2", "0", "unrecognised")]
)
def test_older_or_unknown_servers_are_named(major: str, minor: str, message: str) -> None:
    with pytest.raises(LayoutError, match=message):
        layout_for_server(major, minor)


def test_probes_differ_where_the_layouts_differ() -> None:
    [together] = probe_slices("1.34", node="n1", driver="gpu.tangram.dev")
    counters, devices = probe_slices("1.36", node="n1", driver="gpu.tangram.dev")
    assert {"sharedCounters", "devices"} <= together["spec"].keys()
    assert "devices" not in counters["spec"] and "sharedCounters" not in devices["spec"]
    assert devices["spec"]["devices"][0]["consumesCounters"][0]["counterSet"] == "probe"
