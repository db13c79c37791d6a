"""Generated traces over a small mixed fleet: whole-GPU and MIG claims, and releases."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tangram.allocation import Claim
from tests.allocation.machines import a100_mig, h100_nvl, hgx, profile_is, request

NODES = [hgx("hgx"), h100_nvl("nvl", gpus=4), a100_mig("a100")]


PROFILES = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me"]


NUMA = "resource.kubernetes.io/numaNode"


whole = st.builds(
    lambda n, match, policy: ("whole", n, match, policy),
    st.integers(1, 5),
    st.booleans(),
    st.sampled_from(["tangram", "first-fit", "best-fit"]),
)


mig = st.builds(
    lambda p, n, policy: ("mig", p, n, policy),
    st.sampled_from(PROFILES),
    st.integers(1, 3),
    st.sampled_from(["tangram", "first-fit", "best-fit"]),
)


release = st.builds(lambda i: ("release", i), st.integers(0, 40))


steps = st.lists(st.one_of(whole, mig, release), min_size=1, max_size=40)


def make_claim(i: int, step: tuple[Any, ...]) -> Claim:
    if step[0] == "whole":
        spec: dict[str, Any] = {"devices": {"requests": [request(count=step[1])]}}
        if step[2]:
            spec["devices"]["constraints"] = [{"matchAttribute": NUMA}]
    else:
        spec = {
            "devices": {
                "requests": [
                    request(
                        device_class="mig.gpu.tangram.dev", count=step[2], selectors=(profile_is(step[1]),)
                    )
                ]
            }
        }
    return Claim(namespace="ns", name=f"c{i}", uid=f"u{i}", spec=spec)
