"""Claims waiting to be asked of the allocator: by priority, then fairly across namespaces (pure).

A claim of higher priority (its pods' PriorityClass) is always asked before one of lower priority.
Among claims of one priority, each namespace has its own first-in, first-out line and the
namespaces take turns, one claim each: a namespace that sends thousands of claims at once delays
another namespace's claim of its priority by at most one of its own per turn, however long its
line is.
"""

from __future__ import annotations

from collections import deque


class _Turns:
    """One priority's lines, one per namespace, served in turns."""

    def __init__(self) -> None:
        self.lines: dict[str, deque[str]] = {}
        self.turns: deque[str] = deque()  # namespaces with claims waiting, in the order they are served

    def push(self, namespace: str, uid: str) -> None:
        line = self.lines.get(namespace)
        if line is None:
            line = self.lines[namespace] = deque()
            self.turns.append(namespace)
        line.append(uid)

    def pop(self, waiting: dict[str, tuple[int, str]], priority: int) -> str | None:
        """The first claim still waiting of the namespace whose turn it is, which then goes last."""
        while self.turns:
            namespace = self.turns.popleft()
            line = self.lines[namespace]
            uid = None
            while line and uid is None:
                candidate = line.popleft()
                if waiting.get(candidate) == (priority, namespace):
                    uid = candidate
            if line:
                self.turns.append(namespace)
            else:
                del self.lines[namespace]
            if uid is not None:
                return uid
        return None


class FairQueue:
    def __init__(self) -> None:
        self._levels: dict[int, _Turns] = {}
        self._where: dict[str, tuple[int, str]] = {}  # uid -> (priority, namespace), for those waiting

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, uid: object) -> bool:
        return uid in self._where

    def push(self, namespace: str, uid: str, priority: int = 0) -> bool:
        """Put the claim at the end of its namespace's line of its priority; False when it is
        waiting already."""
        if uid in self._where:
            return False
        self._levels.setdefault(priority, _Turns()).push(namespace, uid)
        self._where[uid] = (priority, namespace)
        return True

    def pop(self) -> str | None:
        """The next claim: of the highest priority waiting, the first of the namespace whose turn
        it is."""
        while self._levels:
            priority = max(self._levels)
            uid = self._levels[priority].pop(self._where, priority)
            if not self._levels[priority].turns:
                del self._levels[priority]
            if uid is not None:
                del self._where[uid]
                return uid
        return None

    def discard(self, uid: str) -> None:
        """The claim no longer waits (deleted, or decided another way); its place is skipped."""
        self._where.pop(uid, None)
