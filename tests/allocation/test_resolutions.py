"""The resolutions a fleet keeps: the same answer for the same spec and classes, never a stale one."""

from __future__ import annotations

import pytest

from tangram.allocation.requests import ClaimError
from tangram.allocation.resolutions import KEPT_SPEC_BYTES, Resolutions
from tangram.allocation.spec import parse_claim_spec
from tests.allocation.machines import CLASSES, DRIVER, device_class, index_is, request


def spec(*requests: dict[str, object]) -> dict[str, object]:
    return {"devices": {"requests": list(requests)}}


def test_the_same_spec_and_classes_give_the_resolution_kept() -> None:
    kept = Resolutions(DRIVER)
    first = kept.resolve(spec(request(count=2)), CLASSES)
    again = kept.resolve(spec(request(count=2)), dict(CLASSES))  # another mapping, the same classes
    assert again is first
    assert first.claim.requests[0].alternatives[0].count == 2
    assert first.kind is not None and first.kind.count == 2
    assert len(kept) == 1


def test_a_class_replaced_by_another_object_is_resolved_again() -> None:
    kept = Resolutions(DRIVER)
    narrow = {"gpu.tangram.dev": device_class("gpu.tangram.dev", index_is(3))}
    wider = {"gpu.tangram.dev": device_class("gpu.tangram.dev", index_is(3, 4))}
    one = kept.resolve(spec(request()), narrow)
    other = kept.resolve(spec(request()), wider)
    selectors = [r.claim.requests[0].alternatives[0].selectors for r in (one, other)]
    expressions = [[selector.expression for _, selector in each] for each in selectors]
    assert expressions[0] != expressions[1]
    assert expressions[1] == [index_is(3, 4)]


def test_errors_are_raised_again_each_time_with_their_reason() -> None:
    kept = Resolutions(DRIVER)
    unknown = spec(request(device_class="nope.tangram.dev"))
    raised = []
    for _ in range(2):
        with pytest.raises(ClaimError, match=r"nope\.tangram\.dev") as error:
            kept.resolve(unknown, CLASSES)
        raised.append(error.value)
    assert raised[0] is not raised[1] and str(raised[0]) == str(raised[1])
    with pytest.raises(ValueError, match="DNS label"):
        kept.resolve(spec({"name": "Bad_Name", "exactly": {"deviceClassName": "x"}}), CLASSES)


def test_it_keeps_a_bounded_number() -> None:
    kept = Resolutions(DRIVER, kept=2)
    answers = [kept.resolve(spec(request(count=n)), CLASSES) for n in (1, 2, 3)]
    assert len(kept) == 2
    assert kept.resolve(spec(request(count=3)), CLASSES) is answers[2]
    assert kept.resolve(spec(request(count=1)), CLASSES) is not answers[0]  # the oldest went


def test_a_parsed_spec_or_one_that_is_not_json_is_resolved_without_keeping() -> None:
    kept = Resolutions(DRIVER)
    parsed = parse_claim_spec(spec(request()))
    assert kept.resolve(parsed, CLASSES).claim.requests[0].name == "gpus"
    with pytest.raises(ValueError, match="spec"):
        kept.resolve({"devices": {1.5j: "x"}}, CLASSES)
    assert len(kept) == 0


def test_a_spec_too_long_to_keep_is_resolved_each_time() -> None:
    # What the entries hold stays bounded whatever a publisher of claims sends.
    kept = Resolutions(DRIVER)
    padding = "x" * (KEPT_SPEC_BYTES // 2)  # a CEL expression is at most 10,000 characters
    long = spec(request(selectors=(f'device.driver != "{padding}a"', f'device.driver != "{padding}b"')))
    first = kept.resolve(long, CLASSES)
    assert kept.resolve(long, CLASSES) is not first
    assert len(first.claim.requests[0].alternatives[0].selectors) == 3  # the class's and the request's
    assert len(kept) == 0
