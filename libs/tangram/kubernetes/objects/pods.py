"""The pods a follower keeps, indexed by the claims they use (pure).

Finding a claim's pods never walks every pod: a namespace's flood of thousands would make each
claim's turn, and each listing, cost as much as all of them.
"""

from __future__ import annotations

from typing import Any

from tangram.kubernetes.objects.claimbridge import ClaimRef, pod_claims

Key = tuple[str, str]  # (namespace, name)


class PodsByClaim:
    def __init__(self) -> None:
        self.by_key: dict[Key, dict[str, Any]] = {}
        self._users: dict[Key, set[Key]] = {}  # (namespace, claim name) -> pods using that claim

    def clear(self) -> None:
        self.by_key, self._users = {}, {}

    def keep(self, key: Key, pod: dict[str, Any] | None) -> None:
        """Keep the pod as last seen (None: forget it), and which claims it uses."""
        before = self.by_key.pop(key, None)
        for name in [] if before is None else pod_claims(before) or []:
            users = self._users.get((key[0], name))
            if users is not None:
                users.discard(key)
                if not users:
                    del self._users[(key[0], name)]
        if pod is not None:
            self.by_key[key] = pod
            for name in pod_claims(pod) or []:
                self._users.setdefault((key[0], name), set()).add(key)

    def users_of(self, ref: ClaimRef) -> list[dict[str, Any]]:
        """The pods kept that use the claim (`uses_claim`), in a fixed order."""
        return [self.by_key[key] for key in sorted(self._users.get((ref.namespace, ref.name), ()))]

    def claims_used(self) -> set[Key]:
        """(namespace, claim name) of every claim some kept pod uses."""
        return set(self._users)
