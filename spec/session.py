"""Streaming-input sessions (issue 32): a request whose prompt arrives in pieces.

A session is a request with later inputs (``Request.session``): it arrives with its first prompt
and ``max_tokens`` as any request, and each `InputPiece` arrives at its ``step`` with more prompt
tokens and the ``max_tokens`` of the generation that follows it. vLLM 0.33.0 calls such a request
``resumable`` (v1/request.py:34-58 ``StreamingUpdate``; the client sends each piece as another
``add_request`` with the same id, scheduler.py:2931-2943). In order:

1. The session runs its current prompt and generates until a stop or its ``max_tokens``, as any
   request.
2. There it does not finish while a piece is still to come: if the next piece has arrived, the
   session continues at once; otherwise it waits for it (Status.WAITING_FOR_INPUT, in the waiting
   queue), keeping its KV blocks, until the piece arrives (``_handle_stopped_request``,
   scheduler.py:2717-2741).
3. A piece taken up replaces the last sampled token, whose KV was never computed, with the piece's
   tokens: the session's prompt is now its tokens but the last, plus the piece
   (``_update_request_as_session``, scheduler.py:1879-1921), and it waits to be admitted again.
4. Once the generation after its last piece stops, the session finishes as any request does.

A piece's tokens are `piece_tokens` (a fixed function, so that every implementation and the vLLM
host, which cannot import kvsched, append the same ids). The trace field, on a request, is
``"session": {"version": 1, "inputs": [{"step": 5, "prompt_len": 3, "max_tokens": 2}]}``, left
out for a plain request, so older traces read and write unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spec.errors import InputError

SESSION_VERSION = 1
MAX_PIECES = 1000  # inputs of one session: far past any streaming workload a trace replays
_VOCAB = 50  # spec.types.VOCAB_SIZE (not imported: spec.types imports this module)


@dataclass(frozen=True)
class InputPiece:
    """One later input of a session: ``prompt_len`` more tokens arriving before step ``step``'s
    schedule(), and the most tokens the generation after it may take (``max_tokens``)."""

    step: int
    prompt_len: int
    max_tokens: int

    def to_dict(self) -> dict[str, int]:
        return {"step": self.step, "prompt_len": self.prompt_len, "max_tokens": self.max_tokens}


def piece_tokens(index: int, length: int) -> tuple[int, ...]:
    """The token ids of a session's piece ``index`` (0: its first later input)."""
    return tuple((7 * (index + 1) + i) % _VOCAB for i in range(length))


def session_problem(pieces: tuple[InputPiece, ...]) -> str | None:
    """What is wrong with a session's pieces, or None: each a piece, steps not decreasing."""
    last = 0
    for i, piece in enumerate(pieces):
        if not isinstance(piece, InputPiece):
            return f"input {i} must be an InputPiece, got {type(piece).__name__}"
        for name in ("step", "prompt_len", "max_tokens"):
            value = getattr(piece, name)
            low = 0 if name == "step" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                return f"input {i}: {name} must be an integer >= {low}, got {value!r}"
        if piece.step < last:
            return f"input {i} arrives at step {piece.step}, before input {i - 1} (step {last})"
        last = piece.step
    return None


def session_to_dict(pieces: tuple[InputPiece, ...]) -> dict[str, Any]:
    return {"version": SESSION_VERSION, "inputs": [p.to_dict() for p in pieces]}


def session_from_dict(raw: Any, where: str, max_step: int, max_tokens: int) -> tuple[InputPiece, ...]:
    """``{"version": 1, "inputs": [{step, prompt_len, max_tokens}]}`` -> the pieces."""
    if not isinstance(raw, Mapping):
        raise InputError(where, 'must be an object {"version": 1, "inputs": [...]}')
    for key in raw:
        if key not in ("version", "inputs"):
            raise InputError(f"{where}.{str(key)[:40]}", "unknown field (known: inputs, version)")
    if raw.get("version") != SESSION_VERSION:
        raise InputError(f"{where}.version", f"must be {SESSION_VERSION}, got {raw.get('version')!r}")
    inputs = raw.get("inputs")
    if not isinstance(inputs, list) or len(inputs) > MAX_PIECES:
        raise InputError(f"{where}.inputs", f"must be a list of at most {MAX_PIECES} inputs")
    pieces = []
    for i, item in enumerate(inputs):
        at = f"{where}.inputs[{i}]"
        if not isinstance(item, Mapping) or set(item) != {"step", "prompt_len", "max_tokens"}:
            raise InputError(at, "must be an object {step, prompt_len, max_tokens}")
        values = []
        for name, low, high in (("step", 0, max_step), ("prompt_len", 1, max_tokens), ("max_tokens", 1, max_tokens)):
            value = item[name]
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InputError(f"{at}.{name}", f"must be an integer in [{low}, {high}], got {value!r}")
            values.append(value)
        pieces.append(InputPiece(*values))
    problem = session_problem(tuple(pieces))
    if problem is not None:
        raise InputError(f"{where}.inputs", problem)
    return tuple(pieces)


def arrived(pieces: tuple[InputPiece, ...], step: int) -> int:
    """How many of a session's pieces have arrived before step ``step``'s schedule()."""
    return sum(1 for p in pieces if p.step <= step)
