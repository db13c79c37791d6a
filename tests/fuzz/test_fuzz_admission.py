"""The admission webhook and the class rule over hostile input.

The documented outcomes: a body is a PodReview or raises BadReview (never another exception, also
for deeply nested JSON); a pod's claim references and the gate patch come out of any pod object;
a DeviceClass, a selector or a claim spec of any shape is Tangram's or not, never an exception.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.admission.review import BadReview, PodReview, claim_references, gate_patch, parse
from tangram.kubernetes.objects.classes import is_tangram_claim, is_tangram_class, requires_driver

from .strategies import FUZZ, TIMEOUT_S, depths, hostile_values, json_values, text, with_deep

pytestmark = pytest.mark.timeout(TIMEOUT_S)


def review_around(request: Any) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


requests = st.fixed_dictionaries(
    {},
    optional={
        "uid": text | json_values,
        "kind": st.just({"group": "", "version": "v1", "kind": "Pod"}) | hostile_values,
        "operation": st.sampled_from(["CREATE", "UPDATE"]) | hostile_values,
        "namespace": text | hostile_values,
        "object": st.fixed_dictionaries({}, optional={"spec": hostile_values, "metadata": hostile_values})
        | hostile_values,
        "dryRun": hostile_values,
        "subResource": hostile_values,
    },
)


@FUZZ
@given(request=requests | hostile_values, depth=depths, raw=st.binary(max_size=200))
def test_any_body_is_a_review_or_a_bad_review(request: Any, depth: int, raw: bytes) -> None:
    for body in (with_deep(json.dumps(review_around(request)).encode(), depth), raw):
        try:
            parsed = parse(body)
        except BadReview as error:
            assert str(error)
            continue
        assert isinstance(parsed, PodReview) and parsed.uid and parsed.namespace
        references = claim_references(parsed.pod)
        assert all(
            source in ("ResourceClaim", "ResourceClaimTemplate") and name for source, name in references
        )
        patch = gate_patch(parsed.pod)
        assert patch is None or patch[0]["op"] == "add"


@FUZZ
@given(device_class=hostile_values, spec=hostile_values, expression=text)
def test_any_class_selector_or_claim_is_judged_without_an_exception(
    device_class: Any, spec: Any, expression: str
) -> None:
    assert is_tangram_class(device_class) in (True, False)
    assert requires_driver(expression) in (True, False)
    assert is_tangram_claim(spec if isinstance(spec, dict) else {}, lambda name: name.startswith("g")) in (
        True,
        False,
    )
    # a hostile selector inside a well-formed class
    assert is_tangram_class({"spec": {"selectors": [{"cel": {"expression": expression}}]}}) in (True, False)
