"""Reproducer: vLLM V1's encoder-decoder encoder cache credits a request's encoder slots again on
every decode step, so can_allocate admits more encoder inputs than the cache holds
(vllm-project/vllm#55733; open fix #51228).

Standalone: it imports the engine, never kvsched. Written by hand (kvsched's hosts build no
encoder-decoder scheduler: cross-attention needs an encoder-decoder model config), for vllm==0.33.0
(the installed vLLM, on CPU, no model).

    python THIS_FILE            # exit 1 and one FAILED line when the property breaks
    python -m pytest THIS_FILE

How: vLLM's own EncoderDecoderCacheManager and Requests with one audio input each, as
tests/v1/core/test_encoder_cache_manager.py builds them; each step, the scheduler's own
Scheduler._free_encoder_inputs (the routine update_from_output calls for every request with encoder
inputs once its step ran, scheduler.py:2388-2389) runs for every request of the step, on a stand-in
that has only what it reads (is_encoder_decoder, encoder_cache_manager, ec_connector None).
Admission is what Scheduler._try_schedule_encoder_inputs does: can_allocate, then allocate.

Asserts: can_allocate never admits an encoder input beside others that already fill the cache
(the cache's free space is its size less the embeddings of the inputs admitted and not yet freed,
each input freed once, when its request has computed a token).
"""

import functools
import os
import sys
import types

import vllm
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.v1.core.encoder_cache_manager import EncoderDecoderCacheManager
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

ENGINE = f"vllm {vllm.__version__} from {os.path.dirname(vllm.__file__)}"
CACHE_SIZE = 100  # encoder embeddings: one Whisper-like audio input of 100 embeddings fits
EMBEDS = 100
# step -> the requests that arrive before it; a request whose encoder input does not fit waits and
# tries again the next step, and every admitted request runs in every step from its admission on
# (its first step computes its prompt: the encoder output is then in the cross-attention KV)
ARRIVALS = {0: ["A"], 3: ["B", "C"]}
STEPS = 6


def audio_request(request_id: str) -> Request:
    """A request with one encoder input at position 0 (encoder-decoder: every input sits at 0)."""
    audio = MultiModalFeatureSpec(data=None, modality="audio", identifier=f"audio-{request_id}",
                                  mm_position=PlaceholderRange(offset=0, length=EMBEDS))
    return Request(request_id, [0] * EMBEDS, SamplingParams(max_tokens=8), None, mm_features=[audio])


def scheduler_stand_in(manager) -> types.SimpleNamespace:
    stand_in = types.SimpleNamespace(is_encoder_decoder=True, encoder_cache_manager=manager, ec_connector=None)
    stand_in._free_encoder_input = functools.partial(Scheduler._free_encoder_input, stand_in)
    return stand_in


def replay() -> dict:
    manager = EncoderDecoderCacheManager(cache_size=CACHE_SIZE)
    scheduler = scheduler_stand_in(manager)
    waiting: list = []
    running: list = []
    held: dict = {}  # request id -> embeddings its admitted encoder input holds until it is freed once
    admissions = 0
    for step in range(STEPS):
        waiting += [audio_request(rid) for rid in ARRIVALS.get(step, ())]
        for request in list(waiting):  # Scheduler._try_schedule_encoder_inputs: can_allocate, then allocate
            if not manager.can_allocate(request, 0, encoder_compute_budget=CACHE_SIZE, num_embeds_to_schedule=0):
                break
            rid = request.request_id
            if sum(held.values()) + EMBEDS > CACHE_SIZE:
                raise AssertionError(
                    f"step {step}: can_allocate admitted {rid}'s {EMBEDS} encoder embeddings while {sorted(held)} "
                    f"still hold {sum(held.values())} of a cache of {CACHE_SIZE}: num_free_slots read "
                    f"{manager.num_free_slots}, because Scheduler._free_encoder_inputs freed A's encoder input "
                    f"again at each of its decode steps. Expected: an encoder input is admitted only where the "
                    f"cache has room for it (its embeddings freed once)")
            manager.allocate(request, 0)
            admissions += 1
            held[rid] = EMBEDS
            waiting.remove(request)
            running.append(request)
        for request in running:  # the step runs: a prompt is computed, then one token a step
            request.num_computed_tokens += request.num_prompt_tokens if request.num_computed_tokens == 0 else 1
            Scheduler._free_encoder_inputs(scheduler, request)  # as update_from_output calls it
            held.pop(request.request_id, None)  # freed once its request computed a token
    if waiting:
        raise AssertionError(f"{[r.request_id for r in waiting]} never admitted in {STEPS} steps")
    return {"steps": STEPS, "checked": admissions}


def test_reproducer() -> None:
    replay()


if __name__ == "__main__":
    print(f"engine: {ENGINE}")
    try:
        done = replay()
    except AssertionError as failure:
        print(f"FAILED: {failure}")
        sys.exit(1)
    print(f"passed ({done['steps']} steps, checked at {done['checked']}): each encoder input's embeddings are "
          f"freed once and can_allocate admits an input only where the cache has room")
