"""The pure parts of the admission webhook: reviews in and patches out, certificates made and renewed."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography import x509

from services.admission.certs import TlsMaterial, issue, not_after, renew
from services.admission.keeper import material_of, secret_data
from services.admission.review import BadReview, answer, claim_references, gate_patch, parse
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tests.admission.reviews import review

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOSTS = ("tangram-admission.tangram.svc", "tangram-admission", "127.0.0.1")


def raw(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def test_a_pod_create_is_parsed() -> None:
    parsed = parse(raw(review()))
    assert (parsed.uid, parsed.namespace, parsed.dry_run) == ("0b5d-1", "team-a", False)


@pytest.mark.parametrize(
    ("body", "why", "uid"),
    [
        (b"not json", "not JSON", None),
        (b"\xff\xfe", "not JSON", None),
        (b"[]", "not an object", None),
        (raw({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}), "expected kind", None),
        (raw({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), "no request", None),
        (raw(review(uid="")), "no uid", None),
        (raw(review(uid="x" * 500)), "no uid", None),
        (
            raw(review(kind={"group": "apps", "version": "v1", "kind": "Deployment"})),
            "not for a v1 Pod",
            "0b5d-1",
        ),
        (raw(review(operation="UPDATE")), "not a CREATE", "0b5d-1"),
        (raw(review(subResource="status")), "subresource", "0b5d-1"),
        (raw(review(object=None)), "no pod", "0b5d-1"),
        (raw(review(object={"spec": "x"})), "no pod", "0b5d-1"),
        (raw(review(namespace="")), "no namespace", "0b5d-1"),
    ],
)
def test_anything_but_a_pod_create_is_a_bad_review(body: bytes, why: str, uid: str | None) -> None:
    with pytest.raises(BadReview, match=why) as caught:
        parse(body)
    assert caught.value.uid == uid


def test_claims_come_from_claims_or_templates() -> None:
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "a", "resourceClaimName": "shared"},
                {"name": "b", "resourceClaimTemplateName": "small"},
                {"name": "c"},
                "junk",
            ]
        }
    }
    assert claim_references(pod) == [("ResourceClaim", "shared"), ("ResourceClaimTemplate", "small")]
    assert claim_references({"spec": {}}) == []
    assert claim_references({"spec": {"resourceClaims": "x"}}) == []


def test_the_gate_is_added_once_beside_other_gates_and_never_to_a_bound_pod() -> None:
    assert gate_patch({"spec": {}}) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": SCHEDULING_GATE}]}
    ]
    assert gate_patch({"spec": {"schedulingGates": [{"name": "other"}]}}) == [
        {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": SCHEDULING_GATE}}
    ]
    assert gate_patch({"spec": {"schedulingGates": [{"name": SCHEDULING_GATE}]}}) is None
    assert gate_patch({"spec": {"nodeName": "n1"}}) is None


def test_the_answer_allows_and_carries_the_patch_as_base64_json() -> None:
    patch = gate_patch({"spec": {}})
    response = answer("u1", patch)["response"]
    assert response["allowed"] is True and response["uid"] == "u1" and response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == patch
    assert answer("u2")["response"] == {"uid": "u2", "allowed": True}


def _cert(material: TlsMaterial) -> x509.Certificate:
    return x509.load_pem_x509_certificate(material.cert)


def test_issued_certificates_name_the_hosts_and_chain_to_the_bundle() -> None:
    material = issue(HOSTS, NOW)
    cert = _cert(material)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == set(HOSTS[:2])
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    (ca,) = x509.load_pem_x509_certificates(material.ca_bundle)
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    # good as it is: nothing to renew
    assert renew(material, HOSTS, NOW + timedelta(days=200)) is None
    # the Secret round trip keeps every byte
    assert material_of({"data": secret_data(material)}) == material
    assert material_of({"data": {"tls.crt": "!!"}}) is None


def test_the_serving_certificate_is_renewed_with_a_third_of_its_life_left_under_the_same_ca() -> None:
    material = issue(HOSTS, NOW, serving_days=90)
    later = NOW + timedelta(days=61)
    fresh = renew(material, HOSTS, later, serving_days=90)
    assert fresh is not None and fresh.ca_bundle == material.ca_bundle and fresh.ca_key == material.ca_key
    assert not_after(fresh) > not_after(material)
    (ca,) = x509.load_pem_x509_certificates(fresh.ca_bundle)
    _cert(fresh).verify_directly_issued_by(ca)


def test_a_new_host_or_a_foreign_certificate_means_a_new_serving_certificate() -> None:
    material = issue(HOSTS, NOW)
    wider = renew(material, (*HOSTS, "tangram-admission.tangram"), NOW)
    assert wider is not None and wider.ca_bundle == material.ca_bundle
    other = issue(HOSTS, NOW)
    mixed = TlsMaterial(material.ca_bundle, material.ca_key, other.cert, other.key)
    fixed = renew(mixed, HOSTS, NOW)
    assert fixed is not None and fixed.cert != other.cert


def test_a_ca_near_expiry_is_replaced_and_the_old_one_stays_in_the_bundle() -> None:
    material = issue(HOSTS, NOW, ca_days=800, serving_days=365)
    later = NOW + timedelta(days=100)  # 700 days left < two serving lifetimes
    fresh = renew(material, HOSTS, later, ca_days=800, serving_days=365)
    assert fresh is not None and fresh.ca_key != material.ca_key
    new_ca, old_ca = x509.load_pem_x509_certificates(fresh.ca_bundle)
    assert old_ca == x509.load_pem_x509_certificates(material.ca_bundle)[0]
    _cert(fresh).verify_directly_issued_by(new_ca)


def test_unreadable_material_is_replaced_whole() -> None:
    broken = TlsMaterial(b"junk", b"junk", b"junk", b"junk")
    fresh = renew(broken, HOSTS, NOW)
    assert fresh is not None
    assert renew(None, HOSTS, NOW) is not None


def test_a_certificate_from_a_replica_whose_clock_runs_ahead_is_kept_within_an_hour() -> None:
    ahead = issue(HOSTS, NOW + timedelta(minutes=30))
    assert renew(ahead, HOSTS, NOW) is None
    far_ahead = issue(HOSTS, NOW + timedelta(days=2))
    fresh = renew(far_ahead, HOSTS, NOW)
    assert fresh is not None
    # everything it serves is valid now: the CA too
    for cert in (*x509.load_pem_x509_certificates(fresh.ca_bundle)[:1], _cert(fresh)):
        assert cert.not_valid_before_utc <= NOW <= cert.not_valid_after_utc
