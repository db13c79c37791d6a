"""The fleet's nodes, indexed by shape and by (free whole GPUs, longest free MIG slice run).

A claim looks at the few nodes that can possibly fit it, bucket by bucket, never at every device
of the fleet. The demand index (placement.DemandIndex) is kept in step: its sample node of each
shape follows every change of the nodes, and a node is filed under its new state in both.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from tangram.allocation.node import NodeState
from tangram.allocation.placement import DemandIndex

BucketKey = tuple[int, int]


class NodeIndex:
    """Nodes by name, and their names by shape signature and bucket key, each bucket in name order.

    `by_name` is read freely and changed only through put() and remove().
    """

    def __init__(self, demand: DemandIndex) -> None:
        self.by_name: dict[str, NodeState] = {}
        self.demand = demand
        self.buckets: dict[str, dict[BucketKey, list[str]]] = {}
        self._bucket_of: dict[str, tuple[str, BucketKey]] = {}
        # Nodes changed by replayed history since they were last placed in a bucket: a rebuild
        # indexes each once, before the first decision, instead of after every event.
        self._unindexed: set[str] = set()

    def get(self, name: str) -> NodeState | None:
        return self.by_name.get(name)

    def put(self, node: NodeState, old: NodeState | None) -> None:
        """The node as its inventory now reads (`old` is the state it replaces, if any)."""
        signature = node.shape.signature
        self.by_name[node.name] = node
        self._resample(signature)
        if old is not None and old.shape.signature != signature:
            self._resample(old.shape.signature)
        # Indexed before the next decision reads the index: a rebuild folding a thousand
        # inventories then settles each node once, not once per inventory.
        self._unindexed.add(node.name)

    def remove(self, name: str) -> NodeState | None:
        """Forget the node; returns it, or None when it was not there."""
        node = self.by_name.pop(name, None)
        if node is None:
            return None
        self._unindexed.discard(name)
        self.demand.remove(name)
        self._resample(node.shape.signature)
        place = self._bucket_of.pop(name, None)
        if place is not None:
            _remove(self.buckets[place[0]][place[1]], name)
        return node

    def changed(self, name: str) -> None:
        """The node's state changed: it is filed again before the next decision reads the index."""
        self._unindexed.add(name)

    def reindex_changed(self) -> None:
        """Place every node changed since the last decision in its bucket, in name order."""
        for name in sorted(self._unindexed):
            self._file(self.by_name[name])
        self._unindexed.clear()

    def reindex(self, node: NodeState) -> None:
        """File the node under its current state now."""
        self._unindexed.discard(node.name)
        self._file(node)

    def _file(self, node: NodeState) -> None:
        self.demand.place(node)
        place = (node.shape.signature, node.bucket_key())
        current = self._bucket_of.get(node.name)
        if current == place:
            return
        if current is not None:
            _remove(self.buckets[current[0]][current[1]], node.name)
        insort(self.buckets.setdefault(place[0], {}).setdefault(place[1], []), node.name)
        self._bucket_of[node.name] = place

    def _resample(self, signature: str) -> None:
        """Keep the demand index's sample node of a shape current the moment a node of it changes.

        Eligibility and the fits of every kind are read off the sample; a sample missing until
        the node is next indexed would make them depend on when inventories arrive relative to
        decisions, and a rebuilt allocator (or a replay) would weigh placements differently.
        """
        current = self.demand.sample_of(signature)
        if current is not None and self.by_name.get(current.name) is current:
            return
        replacement = self.by_name.get(current.name) if current is not None else None
        if replacement is None or replacement.shape.signature != signature:
            replacement = next(
                (
                    self.by_name[name]
                    for name in sorted(self.by_name)
                    if self.by_name[name].shape.signature == signature
                ),
                None,
            )
        self.demand.set_sample(signature, replacement)


def _remove(names: list[str], name: str) -> None:
    position = bisect_left(names, name)
    if position < len(names) and names[position] == name:
        del names[position]
