"""Which refusals of the API server a chaos run's client waits out, as a pod's controller would."""

from __future__ import annotations

from tangram.chaos.kube.pods import transient
from tangram.kubernetes.api import KubeApiError


def test_a_restarting_api_server_and_its_unsynced_priority_admission_are_waited_out() -> None:
    assert transient(KubeApiError("create Pod p-1", 0, "Unreachable"))
    assert transient(KubeApiError("create Pod p-1", 503, "ServiceUnavailable"))
    assert transient(KubeApiError("create Pod p-1", 429, "TooManyRequests"))
    # a restarted API server's Priority admission, before its cache of PriorityClasses synced
    assert transient(
        KubeApiError(
            "create Pod p-14",
            403,
            "Forbidden",
            'pods "p-14" is forbidden: no PriorityClass with name chaos-low was found',
        )
    )


def test_a_refusal_for_good_is_not_waited_out() -> None:
    assert not transient(KubeApiError("create Pod p-1", 403, "Forbidden", 'pods "p-1" is forbidden: quota'))
    assert not transient(KubeApiError("create Pod p-1", 422, "Invalid", "spec.containers: Required value"))
    assert not transient(ValueError("not an API error"))
