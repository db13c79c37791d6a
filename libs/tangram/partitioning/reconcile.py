"""Start-up reconciliation: what NVML shows against what the log says. Pure decisions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tangram.partitioning.ledger import PartitionLedger
from tangram.partitioning.model import InstanceKey, ObservedInstance

FindingKind = Literal["adopted", "orphan", "empty", "warm", "foreign", "missing"]
CleanMode = Literal["none", "empty", "all"]


@dataclass(frozen=True, slots=True)
class Finding:
    kind: FindingKind
    key: InstanceKey
    reason: str
    claim_uid: str = ""
    observed: ObservedInstance | None = None


def reconcile(observed: list[ObservedInstance], ledger: PartitionLedger) -> list[Finding]:
    """Sort every instance on the node, and every instance the log expects that is gone.

    adopted: a live claim holds it. orphan: Tangram created it for a claim that is gone.
    empty: a GPU instance without a compute instance (a crash between the two creations).
    warm: kept free on purpose. foreign: not Tangram's, left alone. missing: the log says Tangram
    created it for a live claim, NVML does not show it.
    """
    findings: list[Finding] = []
    seen: set[InstanceKey] = set()
    for instance in observed:
        key = instance.key
        seen.add(key)
        where = f"{instance.profile} at slices {key.start}+{key.size} of GPU {key.gpu_uuid}"
        owner = ledger.owner(key)
        created = ledger.created(key)
        if instance.empty:
            findings.append(Finding("empty", key, f"{where} has no compute instance", observed=instance))
        elif owner is not None:
            findings.append(Finding("adopted", key, f"{where} belongs to claim {owner}", owner, instance))
        elif ledger.is_warm(key):
            findings.append(Finding("warm", key, f"{where} is kept warm", observed=instance))
        elif created is not None:
            claim = created.claim_uid
            findings.append(
                Finding(
                    "orphan",
                    key,
                    f"{where} was created for claim {claim or '?'}, which is gone",
                    claim,
                    instance,
                )
            )
        else:
            findings.append(Finding("foreign", key, f"{where} was not created by Tangram", observed=instance))
    for key in sorted(ledger.created_keys() - seen, key=lambda k: (k.gpu_uuid, k.start)):
        created = ledger.created(key)
        assert created is not None
        if created.claim_uid and ledger.is_live(created.claim_uid):
            findings.append(
                Finding(
                    "missing",
                    key,
                    f"{created.profile} at slices {key.start}+{key.size} of GPU {key.gpu_uuid} "
                    f"for live claim {created.claim_uid} is gone",
                    created.claim_uid,
                )
            )
    return findings


def to_clean(findings: list[Finding], mode: CleanMode) -> list[Finding]:
    """The instances to destroy: empty GPU instances unless `none`; orphans too with `all`.

    Never an instance with processes on it.
    """
    kinds: set[str] = {"none": set(), "empty": {"empty"}, "all": {"empty", "orphan"}}[mode]
    return [f for f in findings if f.kind in kinds and f.observed is not None and not f.observed.in_use]
