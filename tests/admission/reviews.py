"""AdmissionReviews as the API server sends them, and a claim look-up the server tests control."""

from __future__ import annotations

from typing import Any

from services.admission.lookup import Verdict
from services.admission.review import Source


def review(pod: dict[str, Any] | None = None, **request: Any) -> dict[str, Any]:
    body = {
        "uid": "0b5d-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": "team-a",
        "object": pod if pod is not None else {"metadata": {"name": "p"}, "spec": {"containers": []}},
    }
    body.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}


class StubLookup:
    """Gates pods whose claim templates are named `tangram-*`; `fail` makes every look-up fail."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, list[tuple[Source, str]]]] = []
        self.fail: Exception | None = None

    async def verdict(self, namespace: str, references: list[tuple[Source, str]]) -> Verdict:
        self.asked.append((namespace, references))
        if self.fail is not None:
            raise self.fail
        gate = any(name.startswith("tangram-") for _, name in references)
        return Verdict(gate, "stub")
