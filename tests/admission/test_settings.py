"""python -m services.admission's settings: flags, TANGRAM_ADMISSION_* defaults, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.admission import __main__ as admission
from services.admission.connections import ConnectionBounds
from services.allocator.settings import parse_settings
from tangram.kubernetes.objects import alive


def test_defaults_name_the_service_in_its_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANGRAM_ADMISSION_NAMESPACE", "gpu-system")
    settings = admission.parse_args([])
    assert (settings.port, settings.secret, settings.webhook_configuration) == (
        8443,
        "tangram-admission-tls",
        "tangram-admission",
    )
    assert settings.hosts() == (
        "tangram-admission.gpu-system.svc",
        "tangram-admission",
        "tangram-admission.gpu-system",
        "tangram-admission.gpu-system.svc.cluster.local",
    )


def test_the_environment_and_flags_set_everything(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TANGRAM_ADMISSION_NAMESPACE", "x")
    monkeypatch.setenv("TANGRAM_ADMISSION_CERT_HOSTS", "a.example,127.0.0.1")
    monkeypatch.setenv("TANGRAM_ADMISSION_PORT", "9443")
    monkeypatch.setenv("TANGRAM_ADMISSION_CHECK_INTERVAL_S", "60")
    settings = admission.parse_args(["--webhook-configuration", "", f"--work-dir={tmp_path}"])
    assert settings.hosts() == ("a.example", "127.0.0.1")
    assert (settings.port, settings.check_interval_s, settings.webhook_configuration) == (9443, 60.0, None)
    assert admission.parse_args(["--cert-host", "b.example"]).hosts() == ("b.example",)


def test_the_gate_timeout_defaults_to_two_minutes_and_is_set_by_flag_or_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TANGRAM_ADMISSION_NAMESPACE", "x")
    assert admission.parse_args([]).gate_timeout_s == 120.0
    assert admission.parse_args(["--gate-timeout", "0"]).gate_timeout_s == 0.0  # off
    monkeypatch.setenv("TANGRAM_ADMISSION_GATE_TIMEOUT_S", "30")
    assert admission.parse_args([]).gate_timeout_s == 30.0
    assert admission.parse_args(["--gate-timeout=5"]).gate_timeout_s == 5.0


def test_the_connection_bounds_have_defaults_and_are_set_by_flag_or_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TANGRAM_ADMISSION_NAMESPACE", "x")
    assert admission.parse_args([]).bounds() == ConnectionBounds(
        handshake_timeout_s=5.0, idle_timeout_s=30.0, body_timeout_s=10.0, max_connections=400
    )
    monkeypatch.setenv("TANGRAM_ADMISSION_HANDSHAKE_TIMEOUT_S", "2.5")
    monkeypatch.setenv("TANGRAM_ADMISSION_IDLE_TIMEOUT_S", "90")
    monkeypatch.setenv("TANGRAM_ADMISSION_BODY_TIMEOUT_S", "4")
    monkeypatch.setenv("TANGRAM_ADMISSION_MAX_CONNECTIONS", "64")
    assert admission.parse_args([]).bounds() == ConnectionBounds(2.5, 90.0, 4.0, 64)
    flags = ["--handshake-timeout=1", "--idle-timeout", "5", "--body-timeout=3", "--max-connections", "8"]
    assert admission.parse_args(flags).bounds() == ConnectionBounds(1.0, 5.0, 3.0, 8)


@pytest.mark.parametrize(
    "argv",
    [
        ["--handshake-timeout", "0"],
        ["--handshake-timeout", "61"],
        ["--idle-timeout", "-1"],
        ["--body-timeout", "0"],
        ["--max-connections", "0"],
        ["--max-connections", "many"],
        ["--cert-host", "a b"],
        ["--cert-host", "*.example"],
        ["--port", "70000"],
        ["--max-body-bytes", "10"],
        ["--log-level", "loud"],
        ["--lookup-timeout", "0"],
        ["--gate-timeout", "-1"],
    ],
)
def test_bad_settings_are_refused_with_a_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    monkeypatch.setenv("TANGRAM_ADMISSION_NAMESPACE", "x")
    with pytest.raises(SystemExit) as exited:
        admission.parse_args(argv)
    assert exited.value.code == 2
    assert "error" in capsys.readouterr().err


def test_outside_a_pod_the_namespace_is_required(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TANGRAM_ADMISSION_NAMESPACE", raising=False)
    monkeypatch.setattr(admission, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "absent")
    with pytest.raises(SystemExit):
        admission.parse_args([])


def test_the_allocators_lease_is_read_in_the_webhooks_namespace_unless_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TANGRAM_ADMISSION_NAMESPACE", "x")
    assert admission.parse_args([]).allocator_namespace is None  # the webhook's own: x
    assert admission.parse_args(["--allocator-namespace=gpu"]).allocator_namespace == "gpu"
    monkeypatch.setenv("TANGRAM_ADMISSION_ALLOCATOR_NAMESPACE", "tangram")
    assert admission.parse_args([]).allocator_namespace == "tangram"


def test_the_allocator_keeps_its_lease_in_the_namespace_given_else_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TANGRAM_NAMESPACE", raising=False)
    assert parse_settings([]).kubernetes_namespace is None
    assert parse_settings(["--kubernetes-namespace=gpu"]).kubernetes_namespace == "gpu"
    monkeypatch.setenv("TANGRAM_NAMESPACE", "tangram")
    assert parse_settings([]).kubernetes_namespace == "tangram"
    # unset: the pod's own namespace, else tangram-system
    monkeypatch.setattr(alive, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "namespace")
    assert alive.own_namespace(None) == "tangram-system"
    (tmp_path / "namespace").write_text("gpu-operators\n")
    assert alive.own_namespace(None) == "gpu-operators"
    assert alive.own_namespace("given") == "given"
