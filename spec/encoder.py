"""Encoder inputs and LoRA adapters: what a request needs besides tokens and KV blocks.

A multimodal request carries encoder inputs (an image, an audio clip): each fills ``length``
prompt positions from ``position`` on with the encoder's output, one embedding per position, and
is identified by the hash of its content, so that two requests sending the same image share one
encoder output (vLLM 0.33.0 ``v1/core/encoder_cache_manager.py``: ``cached[mm_hash]``). Before a
prompt chunk that covers any of those positions can run, the input's output must be in the encoder
cache: computed in that step (which costs ``length`` of the step's ``encoder_compute_budget``) or
cached by an earlier one (``encoder_cache_size`` embeddings in all).

A LoRA request names an adapter (``lora_id`` > 0); a step's batch can hold at most ``max_loras``
distinct adapters (vLLM's ``LoRAConfig.max_loras``: the GPU slots the adapters are loaded into).

Why one embedding per position: vLLM's ``PlaceholderRange.get_num_embeds`` may count fewer
embeddings than positions (an ``is_embed`` mask); every cost and check here reads ``length``, so a
mask would only scale the numbers, never change which step does what.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from spec.errors import InputError, shown

MAX_HASH_CHARS = 200


@dataclass(frozen=True)
class EncoderInput:
    """One encoder input of a request: its output fills prompt positions ``[position, end)``."""

    position: int
    length: int
    content_hash: str

    @property
    def end(self) -> int:
        return self.position + self.length

    def overlaps(self, start: int, end: int) -> bool:
        """Whether a chunk computing positions ``[start, end)`` reads this input's output."""
        return self.position < end and start < self.end

    def to_dict(self) -> dict[str, Any]:
        return {"position": self.position, "length": self.length, "hash": self.content_hash}

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> EncoderInput:
        if not isinstance(raw, Mapping):
            raise InputError(where, "must be an object {position, length, hash}")
        for key in raw:
            if key not in ("position", "length", "hash"):
                raise InputError(f"{where}.{str(key)[:40]}", "unknown field (known: hash, length, position)")
        for key in ("position", "length", "hash"):
            if key not in raw:
                raise InputError(f"{where}.{key}", "is required")
        position, length, digest = raw["position"], raw["length"], raw["hash"]
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise InputError(f"{where}.position", f"must be an integer >= 0, got {shown(position)}")
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise InputError(f"{where}.length", f"must be an integer >= 1, got {shown(length)}")
        if not isinstance(digest, str) or not digest or len(digest) > MAX_HASH_CHARS:
            raise InputError(f"{where}.hash", f"must be a non-empty string of at most {MAX_HASH_CHARS} characters, "
                             f"got {shown(digest)}")
        return cls(position, length, digest)


class EncoderEntry(NamedTuple):
    """One encoder cache entry as a snapshot shows it (Capability.ENCODER): the embeddings it
    holds and the requests that hold it (vLLM's ``cached[mm_hash]``; empty: kept for reuse, freeable)."""

    size: int
    users: frozenset[str]


def encoder_inputs_problem(inputs: tuple[EncoderInput, ...], prompt_len: int) -> str | None:
    """Why a request's encoder inputs are malformed (None: they are not): each lies inside the
    prompt, in position order, none overlapping the next (vLLM's ``mm_positions`` are sorted and
    disjoint), and one content hash always has one length."""
    lengths: dict[str, int] = {}
    previous_end = 0
    for i, item in enumerate(inputs):
        if item.end > prompt_len:
            return f"[{i}] covers positions {item.position}..{item.end - 1}, past the prompt of {prompt_len}"
        if item.position < previous_end:
            return f"[{i}] starts at {item.position}, inside the input before it (ends at {previous_end})"
        if lengths.setdefault(item.content_hash, item.length) != item.length:
            return f"[{i}] hash {item.content_hash!r} has length {item.length}, elsewhere {lengths[item.content_hash]}"
        previous_end = item.end
    return None


def inputs_in_window(inputs: Iterable[EncoderInput], start: int, end: int) -> list[int]:
    """The indices of the inputs a chunk computing positions ``[start, end)`` reads."""
    return [i for i, item in enumerate(inputs) if item.overlaps(start, end)]
