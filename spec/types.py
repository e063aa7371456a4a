"""The vocabulary every implementation speaks: requests in, scheduler outputs out, outcomes back.

One engine step is ``schedule()`` (a `SchedulerOutput`), the model runs, then the step's outcome
(one token per scheduled sequence; which sequences the environment stopped) is fed back and the
scheduler reports which requests finished (`Finished`). These types are plain frozen data so any
implementation (the reference, the torch twin, an adapter around vLLM) can produce them.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spec.encoder import EncoderInput, encoder_inputs_problem
from spec.errors import InputError
from spec.reasons import Reason
from spec.session import InputPiece, session_problem, session_to_dict
from spec.speculative import DraftDecision
from spec.status import PreemptionMode, Status


def seq_id(request_id: str, index: int) -> str:
    """Sequence ids are ``<request>#<index>``; index 0 is the prompt's sequence, forks follow."""
    return f"{request_id}#{index}"


def request_of(seq: str) -> str:
    return seq.rsplit("#", 1)[0]


VOCAB_SIZE = 50  # token ids of the default prompts and of generated tokens are in [0, VOCAB_SIZE)


def default_prompt_tokens(prompt_len: int) -> tuple[int, ...]:
    """The prompt a request has when its trace gives no token ids: position ``i`` holds token
    ``i % VOCAB_SIZE``. Every default prompt is therefore a prefix of one fixed text, so requests
    without explicit tokens share their prompts' prefixes (what a prefix cache is for)."""
    return tuple(i % VOCAB_SIZE for i in range(prompt_len))


def generated_token(request_id: str, index: int, position: int) -> int:
    """The token the model "samples" for sequence ``index`` of ``request_id`` at ``position``
    (0-based over prompt + output): a fixed function, so every implementation and every real
    engine driven by an adapter appends the same ids and computes the same block keys."""
    return zlib.crc32(f"{request_id}#{index}@{position}".encode()) % VOCAB_SIZE


MAX_ID_CHARS = 256  # far past any id an engine or a trace uses


def shown_id(value: Any) -> str:
    """``value`` as a short, printable repr (``ascii``: escapes what a terminal would act on)."""
    text = ascii(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(value) if isinstance(value, str) else len(text)} characters)"


@dataclass(frozen=True)
class Request:
    """A request (vLLM's sequence group) as the client submits it.

    ``priority``: lower is more urgent (vLLM's convention). ``n``: parallel samples; the group
    starts with one sequence and forks ``n - 1`` more after its prompt is computed.
    """

    request_id: str  # unique in the trace, no '#' (sequence ids are "<request>#<index>")
    prompt_len: int  # prompt tokens, >= 1
    max_tokens: int = 16  # the most tokens each sequence generates (a stop token included)
    n: int = 1  # parallel sequences (the v1 and nano flows: 1)
    priority: int = 0  # lower is more urgent (the priority policy only)
    prompt_tokens: tuple[int, ...] | None = None  # token ids; None: `default_prompt_tokens`
    # Multimodal inputs whose encoder outputs fill prompt positions (spec/encoder.py); () for text.
    encoder_inputs: tuple[EncoderInput, ...] = ()
    lora_id: int = 0  # the LoRA adapter it runs with (spec/encoder.py); 0: the base model
    # Structured output (spec/grammar.py): its grammar is ready from this step on, and it waits
    # (Status.WAITING_FOR_GRAMMAR) until then; None: no grammar to wait for.
    grammar_ready_step: int | None = None
    # A streaming-input session (spec/session.py): its later inputs, each arriving at its step;
    # () for a request whose prompt arrives whole.
    session: tuple[InputPiece, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id or "#" in self.request_id:
            raise InputError("request.id", f"must be a non-empty string without '#', got {shown_id(self.request_id)}")
        # An id is printed in reports, written to HTML and JSON, and sent to engines: printable text
        # of a bounded length (no control or format characters, no lone surrogates, which no
        # encoding can write).
        if len(self.request_id) > MAX_ID_CHARS or not self.request_id.isprintable():
            raise InputError("request.id", f"must be printable text of at most {MAX_ID_CHARS} characters (no control "
                                           f"or format characters, no lone surrogates), got {shown_id(self.request_id)}")
        where = f"request {self.request_id!r}"
        for name, minimum in (("prompt_len", 1), ("max_tokens", 1), ("n", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise InputError(f"{where}.{name}", f"must be an integer >= {minimum}, got {value!r}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise InputError(f"{where}.priority", f"must be an integer, got {self.priority!r}")
        if self.prompt_tokens is not None:
            tokens = self.prompt_tokens
            if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__len__"):
                raise InputError(f"{where}.prompt_tokens", f"must be a list of token ids, got {tokens!r}")
            tokens = tuple(tokens)
            bad = [t for t in tokens if isinstance(t, bool) or not isinstance(t, int) or t < 0]
            if bad:
                raise InputError(f"{where}.prompt_tokens", f"must hold integers >= 0, got {bad[0]!r}")
            if len(tokens) != self.prompt_len:
                raise InputError(
                    f"{where}.prompt_tokens", f"has {len(tokens)} ids but prompt_len is {self.prompt_len}"
                )
            object.__setattr__(self, "prompt_tokens", tokens)
        if self.encoder_inputs:
            object.__setattr__(self, "encoder_inputs", tuple(self.encoder_inputs))
            problem = encoder_inputs_problem(self.encoder_inputs, self.prompt_len)
            if problem is not None:
                raise InputError(f"{where}.encoder_inputs", problem)
        if isinstance(self.lora_id, bool) or not isinstance(self.lora_id, int) or self.lora_id < 0:
            raise InputError(f"{where}.lora_id", f"must be an integer >= 0, got {self.lora_id!r}")
        ready = self.grammar_ready_step
        if ready is not None and (isinstance(ready, bool) or not isinstance(ready, int) or ready < 0):
            raise InputError(f"{where}.grammar_ready_step", f"must be an integer >= 0 or null, got {ready!r}")
        if self.session:
            object.__setattr__(self, "session", tuple(self.session))
            problem = session_problem(self.session)
            if problem is not None:
                raise InputError(f"{where}.session", problem)

    def prompt_token_ids(self) -> tuple[int, ...]:
        """The prompt's token ids: the given ones, or the deterministic default."""
        return self.prompt_tokens if self.prompt_tokens is not None else default_prompt_tokens(self.prompt_len)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.request_id,
            "prompt_len": self.prompt_len,
            "max_tokens": self.max_tokens,
            "n": self.n,
            "priority": self.priority,
        }
        if self.prompt_tokens is not None:
            data["prompt_tokens"] = list(self.prompt_tokens)
        if self.encoder_inputs:
            data["encoder_inputs"] = [item.to_dict() for item in self.encoder_inputs]
        if self.lora_id:
            data["lora_id"] = self.lora_id
        if self.grammar_ready_step is not None:
            data["grammar_ready_step"] = self.grammar_ready_step
        if self.session:
            data["session"] = session_to_dict(self.session)
        return data


@dataclass(frozen=True)
class ScheduledSeq:
    """One sequence in this step's batch: how many tokens it computes, prefill or decode."""

    seq_id: str  # "<request>#<index>"
    request_id: str  # its request
    num_tokens: int  # tokens it computes in this step (a whole prompt, a chunk, or 1 for a decode)
    is_prefill: bool  # true while it computes prompt tokens (a recompute's prefill too)
    # Of ``num_tokens``, the draft tokens it verifies (speculative decoding, spec/speculative.py):
    # the last ``num_drafts`` positions, past the sequence's known tokens.
    num_drafts: int = 0


@dataclass(frozen=True)
class Preempted:
    request_id: str  # the victim
    mode: PreemptionMode  # RECOMPUTE (back to waiting) or SWAP (its blocks to CPU)


@dataclass(frozen=True)
class SchedulerOutput:
    """What one ``schedule()`` decided.

    ``swap_out`` maps GPU block -> CPU block, ``swap_in`` CPU block -> GPU block, ``copies``
    GPU source -> GPU destination (copy-on-write). ``scheduled`` is in batch order: prefills,
    then decodes in running-queue order, then swapped-in groups.
    """

    step: int  # schedule() calls before this one (0, 1, 2, ...; the adapter counts if the engine does not)
    scheduled: tuple[ScheduledSeq, ...] = ()  # the batch, in batch order
    preempted: tuple[Preempted, ...] = ()  # victims of this step
    swapped_in: tuple[str, ...] = ()  # request ids swapped back in this step
    swap_out: tuple[tuple[int, int], ...] = ()  # (GPU block, CPU block) pairs copied out
    swap_in: tuple[tuple[int, int], ...] = ()  # (CPU block, GPU block) pairs copied in
    copies: tuple[tuple[int, int], ...] = ()  # (GPU source, GPU destination) copy-on-write copies
    ignored: tuple[str, ...] = ()  # request ids ignored this step (each also FINISHED_IGNORED from update())
    reasons: tuple[Reason, ...] = ()  # why (spec.reasons), optional: replay and the HTML view show them
    # The encoder inputs computed in this step, as (request id, index into its encoder_inputs), in
    # the order computed (spec/encoder.py; Capability.ENCODER). Left out of to_dict when empty.
    encoder_inputs: tuple[tuple[str, int], ...] = ()

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def num_prefill_seqs(self) -> int:
        return sum(1 for s in self.scheduled if s.is_prefill)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "scheduled": [
                {"seq": s.seq_id, "request": s.request_id, "tokens": s.num_tokens, "prefill": s.is_prefill,
                 **({"drafts": s.num_drafts} if s.num_drafts else {})}
                for s in self.scheduled
            ],
            "preempted": [{"request": p.request_id, "mode": p.mode.value} for p in self.preempted],
            "swapped_in": list(self.swapped_in),
            "swap_out": [list(p) for p in self.swap_out],
            "swap_in": [list(p) for p in self.swap_in],
            "copies": [list(p) for p in self.copies],
            "ignored": list(self.ignored),
            "reasons": [r.to_dict() for r in self.reasons],
            **({"encoder_inputs": [[rid, i] for rid, i in self.encoder_inputs]} if self.encoder_inputs else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SchedulerOutput:
        return cls(
            step=int(data["step"]),
            scheduled=tuple(
                ScheduledSeq(s["seq"], s["request"], int(s["tokens"]), bool(s["prefill"]), int(s.get("drafts", 0)))
                for s in data.get("scheduled", ())
            ),
            preempted=tuple(
                Preempted(p["request"], PreemptionMode(p["mode"])) for p in data.get("preempted", ())
            ),
            swapped_in=tuple(data.get("swapped_in", ())),
            swap_out=tuple((int(a), int(b)) for a, b in data.get("swap_out", ())),
            swap_in=tuple((int(a), int(b)) for a, b in data.get("swap_in", ())),
            copies=tuple((int(a), int(b)) for a, b in data.get("copies", ())),
            ignored=tuple(data.get("ignored", ())),
            reasons=tuple(Reason.from_dict(r) for r in data.get("reasons", ())),
            encoder_inputs=tuple((str(rid), int(i)) for rid, i in data.get("encoder_inputs", ())),
        )


@dataclass(frozen=True)
class StepOutcome:
    """What the model and the environment report back after a step.

    Every scheduled sequence produced one token; ``stopped`` names the sequences whose token was
    a stop token (the environment's choice, taken from the trace). Length limits are the
    scheduler's to apply.
    """

    stopped: frozenset[str] = field(default_factory=frozenset)  # seq ids whose sampled token is a stop token
    # Speculative decoding: the trace's decision per sequence (`spec.speculative.DraftDecision`);
    # a sequence not named gets the default (k proposed, none accepted).
    drafts: Mapping[str, DraftDecision] = field(default_factory=dict)


@dataclass(frozen=True)
class Finished:
    """A request reached a final status (once, ever)."""

    request_id: str  # the request that finished
    status: Status  # FINISHED_STOPPED, FINISHED_LENGTH_CAPPED, FINISHED_ABORTED or FINISHED_IGNORED
    reason: Reason | None = None  # why; an abort the client did not ask for needs kind engine_error (REQ-007)
