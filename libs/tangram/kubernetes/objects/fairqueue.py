"""Claims waiting to be asked of the allocator, served fairly across namespaces (pure).

Each namespace has its own first-in, first-out line; the namespaces take turns, one claim each.
A namespace that sends thousands of claims at once therefore delays another namespace's claim by
at most one of its own per turn, however long its line is: the wait depends on how many
namespaces are waiting, never on how much one of them sent.
"""

from __future__ import annotations

from collections import deque


class FairQueue:
    def __init__(self) -> None:
        self._lines: dict[str, deque[str]] = {}
        self._turns: deque[str] = deque()  # namespaces with claims waiting, in the order they are served
        self._where: dict[str, str] = {}  # uid -> its namespace, for the claims waiting

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, uid: object) -> bool:
        return uid in self._where

    def push(self, namespace: str, uid: str) -> bool:
        """Put the claim at the end of its namespace's line; False when it is waiting already."""
        if uid in self._where:
            return False
        line = self._lines.get(namespace)
        if line is None:
            line = self._lines[namespace] = deque()
            self._turns.append(namespace)
        line.append(uid)
        self._where[uid] = namespace
        return True

    def pop(self) -> str | None:
        """The next claim: the first of the namespace whose turn it is, which then goes last."""
        while self._turns:
            namespace = self._turns.popleft()
            line = self._lines[namespace]
            uid = None
            while line and uid is None:
                candidate = line.popleft()
                if self._where.get(candidate) == namespace:
                    uid = candidate
            if line:
                self._turns.append(namespace)
            else:
                del self._lines[namespace]
            if uid is not None:
                del self._where[uid]
                return uid
        return None

    def discard(self, uid: str) -> None:
        """The claim no longer waits (deleted, or decided another way); its place is skipped."""
        self._where.pop(uid, None)
