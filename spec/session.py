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

A piece may carry encoder inputs of its own (an audio chunk of a realtime session; vLLM's
``StreamingUpdate.mm_features``), their positions counted within the piece. Taken up, they join
the session's encoder inputs after those it has, each position moved by the session's length
once its last sampled token is dropped: where the piece's first token lands
(``_update_request_as_session``, scheduler.py:1899-1905, ``offset + base``). Such a session is
written as version 2, ``{"step", "prompt_len", "max_tokens", "encoder_inputs": [...]}`` on each
piece that has any; version 1 has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spec.encoder import EncoderInput, encoder_inputs_problem
from spec.errors import InputError

SESSION_VERSION = 1
SESSION_VERSION_ENCODER = 2  # a piece with encoder inputs
MAX_PIECES = 1000  # inputs of one session: far past any streaming workload a trace replays
_VOCAB = 50  # spec.types.VOCAB_SIZE (not imported: spec.types imports this module)


@dataclass(frozen=True)
class InputPiece:
    """One later input of a session: ``prompt_len`` more tokens arriving before step ``step``'s
    schedule(), and the most tokens the generation after it may take (``max_tokens``)."""

    step: int
    prompt_len: int
    max_tokens: int
    encoder_inputs: tuple[EncoderInput, ...] = ()  # positions within the piece (module docstring)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"step": self.step, "prompt_len": self.prompt_len, "max_tokens": self.max_tokens}
        if self.encoder_inputs:
            data["encoder_inputs"] = [item.to_dict() for item in self.encoder_inputs]
        return data


def taken_up_inputs(piece: InputPiece, base: int) -> tuple[EncoderInput, ...]:
    """A piece's encoder inputs once taken up by a session ``base`` tokens long (its last sampled
    token dropped): at the positions the piece's tokens then have."""
    return tuple(EncoderInput(item.position + base, item.length, item.content_hash) for item in piece.encoder_inputs)


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
        if piece.encoder_inputs:
            problem = encoder_inputs_problem(tuple(piece.encoder_inputs), piece.prompt_len)
            if problem is not None:
                return f"input {i}: encoder_inputs: {problem}"
        if piece.step < last:
            return f"input {i} arrives at step {piece.step}, before input {i - 1} (step {last})"
        last = piece.step
    return None


def session_to_dict(pieces: tuple[InputPiece, ...]) -> dict[str, Any]:
    version = SESSION_VERSION_ENCODER if any(p.encoder_inputs for p in pieces) else SESSION_VERSION
    return {"version": version, "inputs": [p.to_dict() for p in pieces]}


def session_from_dict(raw: Any, where: str, max_step: int, max_tokens: int) -> tuple[InputPiece, ...]:
    """``{"version": 1, "inputs": [{step, prompt_len, max_tokens}]}`` -> the pieces (version 2: a
    piece may have ``encoder_inputs``)."""
    if not isinstance(raw, Mapping):
        raise InputError(where, 'must be an object {"version": 1, "inputs": [...]}')
    for key in raw:
        if key not in ("version", "inputs"):
            raise InputError(f"{where}.{str(key)[:40]}", "unknown field (known: inputs, version)")
    version = raw.get("version")
    if version not in (SESSION_VERSION, SESSION_VERSION_ENCODER) or isinstance(version, bool):
        raise InputError(f"{where}.version", f"must be {SESSION_VERSION} or {SESSION_VERSION_ENCODER}, got {version!r}")
    keys = {"step", "prompt_len", "max_tokens"}
    inputs = raw.get("inputs")
    if not isinstance(inputs, list) or len(inputs) > MAX_PIECES:
        raise InputError(f"{where}.inputs", f"must be a list of at most {MAX_PIECES} inputs")
    pieces = []
    for i, item in enumerate(inputs):
        at = f"{where}.inputs[{i}]"
        if not isinstance(item, Mapping) or not keys <= set(item) <= keys | (
                {"encoder_inputs"} if version == SESSION_VERSION_ENCODER else set()):
            raise InputError(at, "must be an object {step, prompt_len, max_tokens}"
                             + (" and optional encoder_inputs" if version == SESSION_VERSION_ENCODER else ""))
        values = []
        for name, low, high in (("step", 0, max_step), ("prompt_len", 1, max_tokens), ("max_tokens", 1, max_tokens)):
            value = item[name]
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InputError(f"{at}.{name}", f"must be an integer in [{low}, {high}], got {value!r}")
            values.append(value)
        encoder = item.get("encoder_inputs", [])
        if not isinstance(encoder, list):
            raise InputError(f"{at}.encoder_inputs", "must be a list")
        items = tuple(EncoderInput.from_dict(e, f"{at}.encoder_inputs[{j}]") for j, e in enumerate(encoder))
        pieces.append(InputPiece(*values, encoder_inputs=items))
    problem = session_problem(tuple(pieces))
    if problem is not None:
        raise InputError(f"{where}.inputs", problem)
    return tuple(pieces)


def arrived(pieces: tuple[InputPiece, ...], step: int) -> int:
    """How many of a session's pieces have arrived before step ``step``'s schedule()."""
    return sum(1 for p in pieces if p.step <= step)
