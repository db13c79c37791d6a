"""Leader election over a JetStream key-value bucket: one allocator decides at a time.

The leader creates a key (which fails while another holds it) and rewrites it well within the
bucket's TTL. A leader that dies stops rewriting, the key expires, and a follower creates it. A
leader that finds its key rewritten by someone else has lost the lease and must stop deciding.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from tangram.bus.client import Bus
from tangram.bus.declarations import LEADER_BUCKET, KeyValueSpec

log = logging.getLogger("tangram.bus.leader")


class LeadershipLost(RuntimeError):
    """Another holder wrote the lease: this process must stop acting as the leader."""


class LeaderLease:
    def __init__(self, bus: Bus, role: str, holder: str, *, bucket: KeyValueSpec = LEADER_BUCKET) -> None:
        self._bus = bus
        self.role = role
        self.holder = holder
        self._bucket = bucket
        self._revision: int | None = None
        self.renew_every_s = bucket.ttl_s / 3

    @property
    def held(self) -> bool:
        return self._revision is not None

    async def _kv(self) -> KeyValue:
        return await self._bus.jetstream.key_value(self._bucket.bucket)

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this holder leads (True), or until `stop` is set (False)."""
        kv = await self._kv()
        waiting_logged = False
        while not stop.is_set():
            try:
                self._revision = await kv.create(self.role, self.holder.encode())
            except nats.js.errors.KeyWrongLastSequenceError:
                if not waiting_logged:
                    current = await _current_holder(kv, self.role)
                    log.info("waiting for leadership", extra={"role": self.role, "leader": current})
                    waiting_logged = True
            except (nats.errors.Error, nats.js.errors.Error) as exc:
                log.warning("leader election failed, retrying", extra={"role": self.role, "error": str(exc)})
            else:
                log.info("leadership acquired", extra={"role": self.role, "holder": self.holder})
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.renew_every_s)
        return False

    async def hold(self, stop: asyncio.Event) -> None:
        """Renew until `stop` is set; LeadershipLost as soon as the lease is someone else's."""
        kv = await self._kv()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.renew_every_s)
            if stop.is_set():
                return
            try:
                self._revision = await kv.update(self.role, self.holder.encode(), last=self._revision)
            except nats.js.errors.KeyWrongLastSequenceError as exc:
                if await self._take_back_lapsed(kv):
                    continue
                self._revision = None
                raise LeadershipLost(f"the {self.role} lease was taken over; stopping") from exc
            except (nats.errors.Error, nats.js.errors.Error) as exc:
                # A renewal that cannot reach NATS is retried; if the TTL passes meanwhile, the next
                # renewal finds the lease gone or taken and reports the loss.
                log.warning("lease renewal failed", extra={"role": self.role, "error": str(exc)})

    async def _take_back_lapsed(self, kv: KeyValue) -> bool:
        """Keep a lease that only expired: a renewal came late (a stalled or starved process).

        The bucket numbers every write. When nobody wrote the key since our last renewal, our
        re-creation takes the very next number, and nobody can have led in between. Any other
        number means someone did (and may have decided claims we never saw): give it back.
        """
        previous = self._revision
        try:
            revision = await kv.create(self.role, self.holder.encode())
        except (nats.errors.Error, nats.js.errors.Error):
            return False  # someone holds it now, or NATS cannot say: lost either way
        if previous is not None and revision == previous + 1:
            self._revision = revision
            log.warning("lease renewed after it expired; nobody took it meanwhile", extra={"role": self.role})
            return True
        with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
            await kv.delete(self.role, last=revision)
        return False

    async def release(self) -> None:
        """Give the lease up at once so that a follower need not wait for the TTL."""
        if self._revision is None:
            return
        kv = await self._kv()
        with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
            await kv.delete(self.role, last=self._revision)
        self._revision = None
        log.info("leadership released", extra={"role": self.role})


async def _current_holder(kv: KeyValue, role: str) -> str:
    try:
        entry = await kv.get(role)
    except (nats.errors.Error, nats.js.errors.Error):
        return "unknown"
    return entry.value.decode(errors="replace") if entry.value else "unknown"
