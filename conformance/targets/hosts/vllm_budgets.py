"""Encoder inputs, LoRA adapters and pause for the vLLM V1 hosts (issue 32; spec/encoder.py).

Imports only vLLM (it runs in the target's venv, beside ``vllm_v1_host.py``). The host plays the
model runner and the front end, so what a multimodal model and an input processor would supply is
supplied here, and nothing else changes in vLLM's scheduler:

* encoder inputs: each ``{position, length, hash}`` of a request becomes a ``MultiModalFeatureSpec``
  (no data: the scheduler never reads it) with ``PlaceholderRange(offset=position, length=length)``
  (no ``is_embed`` mask: one embedding per position, as the spec counts) and ``identifier`` the
  content hash (vLLM's encoder-cache key, vllm/multimodal/inputs.py:363);
* the encoder budget and cache size: vLLM derives both from the model's largest item
  (``MultiModalBudget``, vllm/v1/core/sched/scheduler.py:266-293); the tiny model has no encoder, so
  the host sets ``Scheduler.max_num_encoder_input_tokens`` to ``config.encoder_compute_budget`` and
  gives the scheduler an ``EncoderCacheManager(cache_size=config.encoder_cache_size)``, the manager
  that scheduler.py:284-293 builds for a decoder-only model;
* LoRA: ``Scheduler.lora_config`` is a ``LoRAConfig(max_loras=config.max_loras)`` (read only by the
  admission check, scheduler.py:1040-1047 and 1091-1102) and a request with ``lora_id`` n > 0 gets
  ``LoRARequest("lora-n", n)``; no adapter is loaded (there are no workers);
* pause: ``Scheduler.set_pause_state`` with vLLM's ``PauseState`` (scheduler.py:3073), as
  ``EngineCore.pause_scheduler`` / ``resume_scheduler`` call it (vllm/v1/engine/core.py:955-987);
  the engine core's own queueing of adds while paused (``_reject_add_while_paused``, core.py:1796) is
  the front end's, which the host does not run: requests reach the scheduler while it is paused.

* grammar waits: a request with ``grammar_ready_step`` k gets ``StructuredOutputsParams(json_object=True)``,
  so vLLM's ``Request`` starts as WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR (vllm/v1/request.py:116-117),
  and the host plays the grammar compiler: before step k's ``schedule()`` it sets the request's
  ``structured_output_request.grammar`` (what ``StructuredOutputManager.grammar_init``'s future would
  deliver), and `ScriptedStructuredOutputs` accepts every sampled token and every draft (there is no
  tokenizer: the grammar's mask is the model runner's, which the host plays).

* streaming-input sessions (spec/session.py): a request with a ``session`` is built ``resumable``
  (v1/request.py:77, 234-237), and the host plays the client sending each later input: before step
  k's ``schedule()`` it calls ``Scheduler.add_request`` with a resumable ``Request`` of the same id
  holding the input's tokens (``piece_tokens``), ``max_tokens`` and encoder inputs (``mm_features`` at
  their positions within the input, as a realtime client sends an audio chunk) (scheduler.py:2931-2943: queued
  while the session runs, taken up at once while it is WAITING_FOR_STREAMING_REQ), and after the
  last input a non-resumable one, the end of the session (``StreamingUpdate.from_request`` is None:
  the session finishes at its next stop, 2732-2736). An input for a session already finished
  (aborted) is not sent.

The snapshot shows the encoder cache as the spec does (``EncoderCacheManager.cached``: content hash
-> the requests holding it, with ``num_embeds_by_hash``; ``num_free_slots`` is the free space) and
the pause state by name.

Each vLLM import is made where it is used: the same V1 host serves older pinned vLLM versions and
Aphrodite (whose packages may lack ``PauseState``), and a trace that uses none of this never asks.
"""

from __future__ import annotations

ENCODER_CACHE_VERSION = 1  # the wire form of Snapshot.encoder_cache (docs/PROTOCOL.md)
PAUSE_STATE_NAMES = {"pause_new": "PAUSED_NEW", "pause_all": "PAUSED_ALL", "resume": "UNPAUSED"}


def install(sched, config: dict) -> None:
    """Give a freshly built scheduler the config's encoder budget and cache and its LoRA slots."""
    budget, size = int(config.get("encoder_compute_budget", 0)), int(config.get("encoder_cache_size", 0))
    if budget or size:
        from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

        sched.max_num_encoder_input_tokens = budget
        sched.encoder_cache_manager = EncoderCacheManager(cache_size=size)
    if config.get("max_loras"):
        from vllm.config import LoRAConfig

        sched.lora_config = LoRAConfig(max_loras=int(config["max_loras"]))


def request_extras(request: dict) -> dict:
    """The keyword arguments of vLLM's ``Request`` for a trace request's encoder inputs and adapter."""
    extras: dict = {}
    inputs = request.get("encoder_inputs") or ()
    if inputs:
        from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

        extras["mm_features"] = [
            MultiModalFeatureSpec(data=None, modality="image", identifier=str(item["hash"]),
                                  mm_position=PlaceholderRange(offset=int(item["position"]), length=int(item["length"])))
            for item in inputs]
    lora = int(request.get("lora_id", 0))
    if lora:
        from vllm.lora.request import LoRARequest

        extras["lora_request"] = LoRARequest(f"lora-{lora}", lora, lora_path=f"/kvsched/no-adapter/{lora}")  # never loaded
    return extras


def encoder_inputs_of(out) -> list:
    """``SchedulerOutput.scheduled_encoder_inputs`` as the wire's ``[[request, index], ...]``, in the
    order the scheduler scheduled them."""
    return [[rid, int(i)] for rid, ids in (out.scheduled_encoder_inputs or {}).items() for i in ids]


def set_pause(sched, op: str) -> bool:
    from vllm.v1.core.sched.interface import PauseState

    sched.set_pause_state(PauseState[PAUSE_STATE_NAMES[op]])
    return True


def snapshot_parts(sched) -> dict:
    """The encoder cache, its free space and the pause state (none of them on a scheduler without)."""
    manager = getattr(sched, "encoder_cache_manager", None)
    if manager is None or not hasattr(manager, "num_embeds_by_hash") or not hasattr(sched, "pause_state"):
        return {}
    entries = {digest: {"size": manager.num_embeds_by_hash.get(digest, 0), "users": sorted(users)}
               for digest, users in manager.cached.items()}
    return {"encoder_cache": {"version": ENCODER_CACHE_VERSION, "entries": entries},
            "encoder_free": manager.num_free_slots,
            "pause_state": sched.pause_state.name.lower()}


def structured_outputs(request: dict) -> dict:
    """The SamplingParams keyword for a request that waits for a grammar (none for one without)."""
    if request.get("grammar_ready_step") is None:
        return {}
    from vllm.sampling_params import StructuredOutputsParams

    return {"structured_outputs": StructuredOutputsParams(json_object=True)}


class ScriptedGrammar:
    """A compiled grammar as the scheduler sees it: present, not an Exception. Its mask is never
    asked for (``get_grammar_bitmask`` is the engine core's call, not the scheduler's)."""


def grammar_ready(request) -> None:
    """The grammar's compilation finished (the future ``grammar_init`` started is done)."""
    request.structured_output_request.grammar = ScriptedGrammar()


def scripted_structured_outputs(vllm_config):
    """A ``StructuredOutputManager`` whose grammars accept every token: the scheduler calls only
    ``accept_tokens`` (scheduler.py:2432) and ``validate_tokens`` (2879, 2907) on it."""
    from vllm.v1.structured_output import StructuredOutputManager

    class ScriptedStructuredOutputs(StructuredOutputManager):
        def accept_tokens(self, request, new_token_ids) -> bool:
            return True

        def validate_tokens(self, request, spec_tokens):
            return spec_tokens

    return ScriptedStructuredOutputs(vllm_config)


def session_extras(request: dict) -> dict:
    """The ``Request`` keyword for a streaming session (none for a plain request)."""
    return {"resumable": True} if (request.get("session") or {}).get("inputs") else {}


def piece_tokens(index: int, length: int) -> list:
    """spec.session.piece_tokens."""
    return [(7 * (index + 1) + i) % 50 for i in range(length)]


class SessionClient:
    """The client of the streaming sessions: each later input, and the end after the last, sent to the
    scheduler before the schedule() of the input's step."""

    def __init__(self) -> None:
        self.pending: dict[str, list] = {}  # session -> its inputs not yet sent, as (index, input)

    def add(self, request: dict) -> None:
        inputs = (request.get("session") or {}).get("inputs") or ()
        if inputs:
            self.pending[request["id"]] = list(enumerate(inputs))

    def send_due(self, sched, step: int, make_request) -> None:
        """``make_request(rid, tokens, max_tokens, resumable, extras)`` builds a vLLM ``Request``;
        ``extras``: an input's encoder inputs as ``mm_features`` at their positions within the input
        (``_update_request_as_session`` moves them to where it lands, scheduler.py:1899-1905)."""
        for rid, left in list(self.pending.items()):
            session = sched.requests.get(rid)
            if session is None or session.is_finished():  # aborted: the client sends nothing more
                del self.pending[rid]
                continue
            while left and left[0][1]["step"] <= step:
                index, piece = left.pop(0)
                sched.add_request(make_request(rid, piece_tokens(index, int(piece["prompt_len"])),
                                               int(piece["max_tokens"]), True, request_extras(piece)))
                if not left:  # the end of the session
                    sched.add_request(make_request(rid, [], 1, False, {}))
            if not left:
                del self.pending[rid]
