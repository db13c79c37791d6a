"""A plain NATS connection that records what the server refuses it: the permission errors arrive
asynchronously (through the client's error callback), so a test publishes or subscribes, then waits
for the error that names the subject."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client as NatsClient

from tests.support.polling import WAIT_S


@dataclass
class RefusalRecorder:
    nc: NatsClient = field(default_factory=NatsClient)
    errors: list[str] = field(default_factory=list)
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def record(self, exc: Exception) -> None:
        async with self.arrived:
            self.errors.append(str(exc))
            self.arrived.notify_all()

    async def connect(self, url: str, **options: Any) -> RefusalRecorder:
        """Connect without reconnecting (a refused connection must not come back as another)."""
        try:
            await self.nc.connect(url, error_cb=self.record, allow_reconnect=False, **options)
        except BaseException:
            await self.nc.close()
            raise
        return self

    def names(self, subject: str) -> bool:
        """Whether an error so far names `subject` (the server quotes it)."""
        return any(f'"{subject.lower()}"' in e.lower() for e in self.errors)

    async def refused(
        self, subject: str, *, subscribe: bool = False, payload: bytes = b"{}", timeout: float = WAIT_S
    ) -> bool:
        """Publish (or subscribe) and wait for the server's permission error naming the subject."""
        if subscribe:
            await self.nc.subscribe(subject)
        else:
            await self.nc.publish(subject, payload)
        await self.nc.flush(timeout=int(timeout))
        async with self.arrived:
            try:
                await asyncio.wait_for(self.arrived.wait_for(lambda: self.names(subject)), timeout)
            except TimeoutError:
                return False
        return True
