"""Pure policy decisions of the partitioner: MIG mode changes and the warm pool."""

from __future__ import annotations

from collections.abc import Mapping

# Ampere (compute capability 8.x) applies a MIG mode change only after a GPU reset; Hopper and
# newer apply it at once, so the partitioner may turn MIG on there without draining anything.
_FIRST_LIVE_TOGGLE_MAJOR = 9


def mig_toggle_needs_reset(compute_capability_major: int) -> bool:
    return compute_capability_major < _FIRST_LIVE_TOGGLE_MAJOR


def enable_mig_refusal(*, needs_reset: bool, processes: int) -> str | None:
    """Why MIG mode may not be turned on now, or None when it may."""
    if needs_reset:
        return (
            "MIG mode is off and this GPU needs a GPU reset to change it (Ampere); "
            "enable MIG on the node beforehand (nvidia-smi -mig 1, then a reset)"
        )
    if processes:
        return f"MIG mode is off and {processes} compute process(es) run on the whole GPU"
    return None


def should_disable_mig(
    *, remaining_instances: int, whole_gpu_claimed: bool, needs_reset: bool, caller_asks: bool = True
) -> bool:
    """MIG stays on when the last instance goes, unless a whole-GPU claim needs the GPU without it.

    Only when no instance remains, the toggle needs no reset, and the caller asks.
    """
    return caller_asks and whole_gpu_claimed and remaining_instances == 0 and not needs_reset


class WarmPoolError(ValueError):
    pass


def parse_warm_pool(text: str) -> dict[str, int]:
    """ "1g.18gb=2,3g.71gb=1" -> {"1g.18gb": 2, "3g.71gb": 1}; "" -> {}."""
    pool: dict[str, int] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        profile, sep, count = item.partition("=")
        profile = profile.strip()
        if not sep or not profile:
            raise WarmPoolError(f"warm pool entry {item!r} is not PROFILE=COUNT (e.g. 1g.18gb=2)")
        try:
            number = int(count)
        except ValueError:
            raise WarmPoolError(
                f"warm pool entry {item!r}: count {count.strip()!r} is not an integer"
            ) from None
        if number < 0:
            raise WarmPoolError(f"warm pool entry {item!r}: count must not be negative")
        if profile in pool:
            raise WarmPoolError(f"warm pool names profile {profile!r} twice")
        pool[profile] = number
    return pool


def keep_warm(profile: str, *, pool: Mapping[str, int], warm_now: int) -> bool:
    """Whether a freed instance of `profile` is kept instead of destroyed."""
    return warm_now < pool.get(profile, 0)
