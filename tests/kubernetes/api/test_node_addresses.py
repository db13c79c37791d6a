"""Which of a Node's addresses its peers are told: internal first, its name when it has none."""

from __future__ import annotations

from types import SimpleNamespace

from tangram.kubernetes.api.nodeaddresses import preferred_address


def address(kind: str, value: str) -> SimpleNamespace:
    return SimpleNamespace(type=kind, address=value)


def test_the_internal_address_is_preferred_then_the_external_then_the_hostname() -> None:
    reported = [address("Hostname", "tray-1.local"), address("ExternalIP", "203.0.113.7")]
    assert preferred_address("tray-1", reported) == "203.0.113.7"
    assert preferred_address("tray-1", [*reported, address("InternalIP", "10.0.0.1")]) == "10.0.0.1"
    assert preferred_address("tray-1", [address("Hostname", "tray-1.local")]) == "tray-1.local"


def test_a_node_reporting_no_usable_address_is_named() -> None:
    assert preferred_address("tray-1", []) == "tray-1"
    assert preferred_address("tray-1", [address("InternalIP", ""), SimpleNamespace(type=None)]) == "tray-1"
