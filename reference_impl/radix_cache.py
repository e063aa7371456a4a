"""SGLang's radix cache at page size 1, readable (``sglang/srt/mem_cache/radix_cache.py``, 0.5.23).

A tree of token runs: each node holds a run of tokens (``key``) and the KV slots that hold them
(``value``, one slot per token). A request's prompt is matched from the root; a match that ends
inside a node splits it (radix_cache.py:677-700, ``_split_node``) so that every match ends on a
node boundary. Nodes carry a lock count: a running request locks the path to its last matched
node (``inc_lock_ref``, 582-595: every node up to the root), so its prefix cannot be evicted.
Sizes are kept as SGLang keeps them: ``evictable_size`` counts the tokens of unlocked nodes,
``protected_size`` those of locked ones.

Eviction is LRU over unlocked leaves (``evict``, 552-580): a heap on ``last_access_time``, each
evicted leaf's slots go back to the allocator in key order, and a parent left childless and
unlocked joins the heap. Access times are ``time.monotonic()`` in SGLang: a match stamps every
node on its path with one reading (651-675), an insert likewise (705-760), and a node created by
an insert or a split takes a fresh reading. Here a logical clock stands for the monotonic clock:
every reading is one tick later than the one before, which is the order the real readings have.

Not modelled: page sizes above 1, ``extra_key`` / cache salt namespaces, hit counts (only the LFU
policy reads them), host tiers, KV events, priorities (all requests have priority 0 here).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(eq=False)
class Node:
    """One run of tokens and their slots (``TreeNode``, radix_cache.py:250-278)."""

    key: list[int]
    value: list[int]
    parent: Node | None
    last_access: int
    children: dict[int, Node] = field(default_factory=dict)  # first token -> child (page size 1)
    lock_ref: int = 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (``RadixKey.match`` at page size 1)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class RadixCache:
    """The tree, its sizes and its evictable leaves; slot freeing is the caller's (``free``)."""

    def __init__(self, free: Callable[[list[int]], None]) -> None:
        self._free = free
        self._clock = 0
        self.root = Node([], [], None, self._tick(), lock_ref=1)  # reset(): the root is locked for good
        self.evictable_size = 0
        self.protected_size = 0
        self.evictable_leaves: set[Node] = set()

    def _tick(self) -> int:
        """One reading of SGLang's ``time.monotonic()``."""
        self._clock += 1
        return self._clock

    # ------------------------------------------------------------------ match, insert, touch
    def match(self, tokens: Sequence[int]) -> tuple[list[int], Node]:
        """The slots of the longest cached prefix of ``tokens`` and the node it ends on
        (``match_prefix`` / ``_match_prefix_helper``, radix_cache.py:364-417, 651-675). Stamps the
        path with one access time and splits the node the match ends inside."""
        key = list(tokens)
        if not key:
            return [], self.root
        now = self._tick()
        node = self.root
        node.last_access = now
        slots: list[int] = []
        while key and key[0] in node.children:
            child = node.children[key[0]]
            child.last_access = now
            n = common_prefix(child.key, key)
            if n < len(child.key):
                node = self._split(child, n)
                slots.extend(node.value)
                break
            slots.extend(child.value)
            node = child
            key = key[n:]
        return slots, node

    def touch(self, tokens: Sequence[int]) -> None:
        """``touch_prefix`` (radix_cache.py:419-426): a match whose result is dropped."""
        self.match(tokens)

    def insert(self, tokens: Sequence[int], slots: Sequence[int]) -> int:
        """Insert ``tokens`` held by ``slots``; returns how many leading tokens were in the tree
        already (their slots in ``slots`` are duplicates the caller frees). ``_insert_helper``,
        radix_cache.py:705-760."""
        key, value = list(tokens), list(slots)
        now = self._tick()
        node = self.root
        node.last_access = now
        if not key:
            return 0
        matched = 0
        while key and key[0] in node.children:
            node = node.children[key[0]]
            node.last_access = now
            n = common_prefix(node.key, key)
            matched += n
            key, value = key[n:], value[n:]
            if n < len(node.key):
                node = self._split(node, n)
        if key:
            leaf = Node(key, value, node, self._tick())
            node.children[key[0]] = leaf
            self.evictable_size += len(key)
            self._update_leaf_status(node)
            self._update_leaf_status(leaf)
        return matched

    def _split(self, child: Node, at: int) -> Node:
        """``_split_node`` (radix_cache.py:677-700): a new node takes the first ``at`` tokens of
        ``child`` (and its lock count); ``child`` keeps the rest below it."""
        parent = child.parent
        assert parent is not None
        upper = Node(child.key[:at], child.value[:at], parent, self._tick(), lock_ref=child.lock_ref)
        upper.children = {child.key[at]: child}
        child.key, child.value, child.parent = child.key[at:], child.value[at:], upper
        parent.children[upper.key[0]] = upper
        return upper

    def path_slots(self, node: Node) -> list[int]:
        """The slots from the root down to ``node`` (``path_device_indices``, 641-649)."""
        runs: list[list[int]] = []
        while node is not self.root:
            runs.append(node.value)
            assert node.parent is not None
            node = node.parent
        return [slot for run in reversed(runs) for slot in run]

    # ------------------------------------------------------------------ locks
    def lock(self, node: Node) -> Node:
        """``inc_lock_ref`` (radix_cache.py:582-595) on the path from ``node`` to the root; returns
        ``node`` (the lock handle SGLang keeps as ``req.lock``)."""
        walk = node
        while walk is not self.root:
            if walk.lock_ref == 0:
                self.evictable_size -= len(walk.key)
                self.protected_size += len(walk.key)
            walk.lock_ref += 1
            self._update_leaf_status(walk)
            assert walk.parent is not None
            walk = walk.parent
        return node

    def unlock(self, node: Node | None) -> None:
        """``dec_lock_ref`` (radix_cache.py:597-616)."""
        walk = node
        while walk is not None and walk is not self.root:
            if walk.lock_ref == 1:
                self.evictable_size += len(walk.key)
                self.protected_size -= len(walk.key)
            walk.lock_ref -= 1
            self._update_leaf_status(walk)
            walk = walk.parent

    def _update_leaf_status(self, node: Node) -> None:
        """``_update_leaf_status`` (radix_cache.py:790-803): an unlocked node without children is
        an evictable leaf."""
        if node.lock_ref > 0 or node.children:
            self.evictable_leaves.discard(node)
        else:
            self.evictable_leaves.add(node)

    # ------------------------------------------------------------------ eviction
    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` slots, least recently used leaf first, while any leaf is
        evictable (radix_cache.py:552-580); returns the tokens evicted. A leaf goes whole."""
        heap = sorted(self.evictable_leaves, key=lambda n: n.last_access)
        evicted = 0
        while evicted < num_tokens and heap:
            leaf = heap.pop(0)
            self._free(list(leaf.value))
            evicted += len(leaf.value)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            self.evictable_size -= len(leaf.key)
            self.evictable_leaves.discard(leaf)
            self._update_leaf_status(parent)
            if not parent.children and parent.lock_ref == 0:
                heap.append(parent)
                heap.sort(key=lambda n: n.last_access)
        return evicted

    def total_size(self) -> int:
        """Tokens held by the tree (``total_size``)."""
        return self.evictable_size + self.protected_size
