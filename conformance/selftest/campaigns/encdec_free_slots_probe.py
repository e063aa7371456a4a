"""Probe: does the installed vLLM's encoder-decoder encoder cache credit its space again on every
decode step? (vllm-project/vllm #55733, open fix #51228; the museum's vllm-encdec-encoder-slots-credited.)

    python -m conformance.selftest.campaigns.encdec_free_slots_probe

Runs in the ``vllm-v1`` target's venv, on vLLM's own ``EncoderDecoderCacheManager`` with no model:
one request with a 100-embedding audio input is allocated, then freed as
``Scheduler._free_encoder_inputs`` frees an encoder-decoder request's inputs on every step once it
has computed a token (v1/core/sched/scheduler.py:2828-2853). Exit 1 and the free-space readings
when the free space grows past the cache size (the fault is there), 0 when it stays at the size.
The scheduler-level consequence (``can_allocate`` admitting more encoder prefills than the cache
holds) is #55733's; the host does not build an encoder-decoder scheduler (docs/CONFORMANCE.md).
"""

from __future__ import annotations

import json
import subprocess
import sys

from conformance.targets import get_target

PROBE = """
import json
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.v1.core.encoder_cache_manager import EncoderDecoderCacheManager
from vllm.v1.request import Request

manager = EncoderDecoderCacheManager(cache_size=100)
audio = MultiModalFeatureSpec(data=None, modality="audio", identifier="a",
                              mm_position=PlaceholderRange(offset=0, length=100))
request = Request("r", [0] * 100, SamplingParams(max_tokens=8), None, mm_features=[audio])
manager.allocate(request, 0)
free = [manager.num_free_slots]
for _ in range(5):
    for input_id in manager.get_cached_input_ids(request):
        manager.free_encoder_input(request, input_id)
    free.append(manager.num_free_slots)
print(json.dumps({"cache_size": manager.cache_size, "free_after_each_step": free}))
"""


def main() -> int:
    python = get_target("vllm-v1").python
    done = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        print(f"probe failed in {python}: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return 2
    result = json.loads(done.stdout.strip().splitlines()[-1])
    grew = max(result["free_after_each_step"]) > result["cache_size"]
    print(json.dumps({**result, "credited_every_step": grew}))
    return 1 if grew else 0


if __name__ == "__main__":
    raise SystemExit(main())
