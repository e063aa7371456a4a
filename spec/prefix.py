"""Content keys for prefix caching: what makes two KV blocks interchangeable.

A full block's KV depends on every token before it, not only on its own ``block_size`` tokens, so
its key is chained: ``key(j) = H(key(j - 1), tokens of block j)``, with ``key(-1)`` empty (vLLM V1:
``hash_block_tokens(parent_block_hash, curr_block_token_ids)``; nano-vllm: ``compute_hash(token_ids,
prefix)``). Two blocks with equal keys hold the KV of equal token prefixes, and only a full block
has a key: a partly filled block is still being written.

The spec fixes one key function so that every implementation's snapshot speaks the same keys; an
adapter around an engine with its own hash maps the engine's keys to these (it knows the tokens).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

ROOT = ""  # the parent key of block 0


def block_key(parent: str, tokens: Sequence[int]) -> str:
    """The key of a full block holding ``tokens`` after the blocks whose last key is ``parent``."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(parent.encode())
    digest.update(b"|")
    digest.update(",".join(map(str, tokens)).encode())
    return digest.hexdigest()


def block_keys(tokens: Sequence[int], block_size: int, limit: int | None = None) -> list[str]:
    """Keys of the full blocks of ``tokens`` (at most the first ``limit`` tokens), in order."""
    end = len(tokens) if limit is None else min(limit, len(tokens))
    keys: list[str] = []
    parent = ROOT
    for start in range(0, end - block_size + 1, block_size):
        parent = block_key(parent, tokens[start : start + block_size])
        keys.append(parent)
    return keys
