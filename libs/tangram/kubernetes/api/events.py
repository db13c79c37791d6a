"""Warning Events on the objects Tangram works on: notes for people, never a reason to stop."""

from __future__ import annotations

import logging
from typing import Any

from tangram.kubernetes.api.client import KubeApiError, call

log = logging.getLogger("tangram.kubernetes.api")


async def record_event(core: Any, event: dict[str, Any], *, timeout_s: float) -> None:
    """Create a core/v1 Event (`core` a CoreV1Api). An Event is a note for people: one that exists
    already (the same note, named alike) is fine, and one that cannot be written is logged, never
    raised, so that the work it describes goes on."""
    metadata = event.get("metadata") or {}
    namespace = str(metadata.get("namespace", ""))
    involved = event.get("involvedObject") or {}
    what = f"record an Event on {involved.get('kind', '')} {namespace}/{involved.get('name', '')}"
    try:
        await call(what, core.create_namespaced_event(namespace, event, _request_timeout=timeout_s))
    except KubeApiError as error:
        if not error.already_exists:
            log.warning("cannot record an Event", extra={"error": str(error)})
