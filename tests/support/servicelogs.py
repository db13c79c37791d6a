"""What the services' logs say about the things a failed run names, for the failure's report: a run
on a loaded machine that fails once in many must say why the one time it does."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

# MIG instance UUIDs, claim uids and pod names of a chaos run, as violations name them
_NAMED = re.compile(
    r"MIG-[0-9a-f-]{36}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\b[a-z]+-\d+\b"
)


def lines_naming(logs: Path, reports: Iterable[str], *, limit: int = 60) -> str:
    """The log lines (file: line) that name anything the reports name, oldest file order first."""
    needles = sorted({match for report in reports for match in _NAMED.findall(report)})
    if not needles or not logs.is_dir():
        return ""
    found: list[str] = []
    for path in sorted(logs.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if any(needle in line for needle in needles):
                found.append(f"{path.name}: {line[:400]}")
    kept = found[-limit:]
    return f"log lines naming {', '.join(needles)} ({len(found)}, the last {len(kept)}):\n" + "\n".join(kept)
