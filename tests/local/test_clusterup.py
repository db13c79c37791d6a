"""`tangram cluster up`'s parts that need no control plane: its flags, the chart's webhook objects
as it runs them off-cluster, and what it tells a person once ready."""

from __future__ import annotations

from pathlib import Path

import pytest

from tangram.local import admission
from tangram.local.clusterup import Running, hints
from tangram.local.processes import LocalCluster, SimNode
from tests.support.cli import tangram


@pytest.mark.parametrize("version", ["1.35", "v1.33.0", "latest"])
def test_a_kubernetes_version_not_built_is_one_line_naming_those_built(
    capsys: pytest.CaptureFixture[str], version: str
) -> None:
    ran = tangram(capsys, "cluster", "up", "--k8s-version", version)
    assert ran.code != 0 and ran.out == ""
    [line] = ran.err.splitlines()
    assert line.startswith("tangram cluster up: --k8s-version:") and version in line
    assert "v1.34.4" in line and "v1.37.2" in line and "Traceback" not in ran.err


def test_an_unknown_decider_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    ran = tangram(capsys, "cluster", "up", "--decider", "random")
    assert ran.code == 2 and "--decider" in ran.err and "kube-scheduler" in ran.err


@pytest.mark.parametrize("kube_version", ["1.34.0", "1.37.0"])
def test_the_chart_webhook_is_pointed_at_loopback_with_its_own_names(kube_version: str) -> None:
    rendered = admission.render(namespace="tangram", kube_version=kube_version)
    objects = admission.webhook_objects(
        rendered,
        port=18443,
        configuration="t-admission",
        namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": "t"}},
    )
    kinds = [o["kind"] for o in objects]
    assert kinds == list(admission.WEBHOOK_KINDS)
    by_kind = {o["kind"]: o for o in objects}
    [webhook] = by_kind["MutatingWebhookConfiguration"]["webhooks"]
    assert webhook["clientConfig"] == {"url": "https://127.0.0.1:18443/mutate"}
    assert webhook["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "t"}}
    assert by_kind["MutatingWebhookConfiguration"]["metadata"]["name"] == "t-admission"
    binding = by_kind["ClusterRoleBinding"]
    assert binding["metadata"]["name"] == binding["roleRef"]["name"] == "t-admission"
    named = [r for r in by_kind["ClusterRole"]["rules"] if "resourceNames" in r]
    assert named and all(r["resourceNames"] == ["t-admission"] for r in named)
    # the namespaced objects keep the chart's names, in the namespace given
    assert {o["metadata"]["namespace"] for o in objects if "namespace" in o["metadata"]} == {"tangram"}
    assert by_kind["ServiceAccount"]["metadata"]["name"] == "tangram-admission"


def test_without_changes_the_chart_names_and_selector_stay() -> None:
    rendered = admission.render(namespace="tangram", kube_version="1.37.0")
    objects = admission.webhook_objects(rendered, port=9)
    config = next(o for o in objects if o["kind"] == "MutatingWebhookConfiguration")
    assert config["metadata"]["name"] == "tangram-admission"
    # the chart's own: every namespace but Tangram's and kube-system
    [expression] = config["webhooks"][0]["namespaceSelector"]["matchExpressions"]
    assert expression["operator"] == "NotIn" and set(expression["values"]) == {"tangram", "kube-system"}


def test_the_hints_name_this_cluster(tmp_path: Path) -> None:
    cluster = LocalCluster([SimNode("node-a", "dgx-h100")], workdir=tmp_path)
    running = Running(
        kubeconfig=tmp_path / "kubeconfig",
        server="https://127.0.0.1:6443",
        nodes=["node-a"],
        workdir=tmp_path,
        decider="tangram",
        nats="nats://127.0.0.1:4222",
    )
    text = "\n".join(hints(running, cluster))
    assert f"export KUBECONFIG={tmp_path / 'kubeconfig'}" in text
    assert "mig-1g.yaml" in text and "tensor-parallel-4gpu.yaml" in text
    assert f"tangram mig show --sim dgx-h100 --state-file {cluster.state_file('node-a')}" in text
    assert "--nats-url nats://127.0.0.1:4222" in text and "TangramUnschedulable" in text
    line = running.line()
    assert '"decider": "tangram"' in line and '"kubernetes": "v1.37.2"' in line
