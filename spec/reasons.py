"""Structured reasons: why the scheduler did what it did, with the numbers that decided it.

A reason is data (a kind and named integers), rendered to a sentence only when a person reads
it. Implementations attach reasons to decisions; reports, the divergence view and the HTML
trace viewer show them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# kind -> sentence template over the reason's numbers (and {request}).
TEMPLATES: dict[str, str] = {
    "admitted": "{request} admitted: prefill of {tokens} tokens into {blocks} new blocks "
    "({free_after} GPU blocks left free, watermark {watermark})",
    "ignored_too_long": "{request} ignored: prompt of {tokens} tokens exceeds the prompt limit {limit} "
    "(min of max_model_len and the token budget)",
    "ignored_never_fits": "{request} ignored: needs {blocks} GPU blocks but only {capacity} can ever be "
    "free above the watermark",
    "ignored_too_many_seqs": "{request} ignored: its {seqs} parallel sequences exceed max_num_seqs {limit}",
    "wait_swapped_first": "{request} waits: {swapped} swapped group(s) resume before any new prefill",
    "wait_blocks": "{request} waits: needs {blocks} GPU blocks, {free} free",
    "wait_watermark": "{request} waits: needs {blocks} GPU blocks, {free} free, but must leave "
    "{watermark} free (watermark)",
    "wait_token_budget": "{request} waits: {tokens} tokens exceed the {left} left in the step's token budget",
    "wait_seq_budget": "{request} waits: {seqs} sequence(s) exceed the {left} seat(s) left of max_num_seqs",
    "wait_prefill_step": "{request} not decoded: this step runs prefills, and decodes do not mix with them",
    "wait_after_preemption": "{request} stays swapped: a preemption happened this step, so no swap-in",
    "decode": "{request} decodes {tokens} token(s) ({new_blocks} new block(s), {copies} copy-on-write)",
    "preempted_recompute": "{request} preempted by recompute: {needed_by} needed {need} free block(s), "
    "{free} free; victim is the running tail (lowest priority, then latest arrival)",
    "preempted_swap": "{request} preempted by swap: {needed_by} needed {need} free block(s), {free} free; "
    "{blocks} block(s) move to CPU",
    "swap_space_exhausted": "{request} preempted by recompute instead of swap: needs {blocks} CPU blocks, "
    "{free} free",
    "preempted_priority": "{request} preempted for higher-priority waiting {needed_by}",
    "swapped_in": "{request} swapped in: {blocks} block(s) back to GPU, {free_after} GPU blocks left free",
    "wait_swap_in": "{request} stays swapped: needs {need} GPU blocks, {free} free, watermark {watermark}",
    "ignored_swap_never_fits": "{request} ignored: swap-in needs {need} GPU blocks, only {capacity} can ever be free",
    "finished_stopped": "{request} finished: every sequence stopped or hit its limit",
    "finished_length_capped": "{request} finished: length limit (max_tokens {max_tokens} or max_model_len {max_model_len})",
    "finished_aborted": "{request} aborted by the client",
    # An engine that ends a request on its own (out of memory, a failed step) says why: a
    # FINISHED_ABORTED the client did not ask for carries this reason (REQ-007, LIV-004).
    "engine_error": "{request} ended by the engine: {error}",
    # today's engines (reference_impl.v1_scheduler, reference_impl.nano_scheduler)
    "prefill_chunk": "{request} prefills {tokens} token(s) of {remaining} uncomputed ({cached} served by the prefix cache)",
    "wait_partial_prefills": "{request} waits: {partial} request(s) are mid-prefill, limit {limit}",
    "wait_running_first": "{request} waits: running requests are served first and a preemption happened this step",
    "wait_seats": "{request} waits: {running} running, max_num_seqs {limit}",
    # encoder and LoRA budgets (spec/encoder.py): passed over for this step, back at the head after it
    "wait_encoder": "{request} waits: its next encoder input needs more than the {left} embeddings of encoder budget "
    "left or the {free} free in the cache",
    "wait_lora_slots": "{request} waits: its LoRA adapter would be one more than the {loras} in use, max_loras {limit}",
    # KV connectors (reference_impl.kv_connector)
    "wait_remote_kv": "{request} waits for its KV load from the connector",
    "finished_error": "{request} finished with an error: its KV load failed (kv_load_failure_policy fail)",
    "wait_grammar": "{request} waits: its grammar is ready only at step {ready}",
    "wait_input": "{request} waits for its next input (a streaming session, holding {blocks} blocks)",
    "evicted_idle_session": "{request} waits for its next input: its {blocks} blocks are freed (it recomputes once "
    "the input comes) so that {needed_by} can run while nothing else does",
    # SGLang's flow (reference_impl.sglang_scheduler)
    "wait_reserved_tokens": "{request} waits: needs {tokens} KV slots (its prefill, its max_new_tokens and one page), "
    "only {left} left once every running and admitted request's remaining output is reserved at new-token ratio "
    "{ratio}",
    "wait_input_budget": "{request} waits: its {tokens} prefill tokens reach the {left} left of the step's input budget",
    "retracted": "{request} retracted: the decode batch needs {need} KV slot(s), {free} free after eviction; "
    "SGLang retracts the fewest generated tokens first, then the longest prompt",
    "ignored_input_limit": "{request} refused: prompt of {tokens} tokens reaches SGLang's input limit {limit} "
    "(max_req_len - 5)",
}


@dataclass(frozen=True)
class Reason:
    kind: str
    request_id: str
    numbers: tuple[tuple[str, int | str], ...] = ()

    @classmethod
    def of(cls, kind: str, request_id: str, **numbers: int | str) -> Reason:
        if kind not in TEMPLATES:
            raise KeyError(f"unknown reason kind {kind!r}")
        return cls(kind, request_id, tuple(sorted(numbers.items())))

    def get(self, name: str) -> int | str:
        return dict(self.numbers)[name]

    def text(self) -> str:
        values: dict[str, Any] = {"request": self.request_id, **dict(self.numbers)}
        try:
            return TEMPLATES[self.kind].format(**values)
        except (KeyError, IndexError):
            return f"{self.request_id}: {self.kind} {dict(self.numbers)}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "request": self.request_id, "numbers": dict(self.numbers), "text": self.text()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Reason:
        return cls(str(data["kind"]), str(data["request"]), tuple(sorted(dict(data.get("numbers", {})).items())))
