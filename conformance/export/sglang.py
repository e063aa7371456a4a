"""Export to SGLang (``sglang``: sglang==0.5.23). SGLang's ``Scheduler`` cannot be built without a
TP worker and a model, and its unit tests build the parts instead (test/registered/unit/managers/
test_prefill_adder.py: a ``PrefillAdder`` over a tree cache, a token allocator and a running
batch, with the global ServerArgs published first): the file does the same with the real parts on
CPU (``RadixCache``, ``ReqToTokenPool``, ``TokenToKVPoolAllocator``, ``SchedulePolicy``,
``ScheduleBatch``, ``Req``) and replays the Scheduler's event-loop glue from managers/scheduler.py,
as conformance/targets/hosts/sglang_host.py does (the same door, token ids and result handling).

SGLang has no defect finding (no failure in 300 traces of each profile, docs/CONFORMANCE.md); its
exported file is the lockstep deviation trace it fails (the first prefill admitted above the token
budget, BUD-001), as the both-ways record says.
"""

from __future__ import annotations

from conformance.export.record import Exporter, token_ids

PROPERTIES = ("FAULT-raised", "LIV-001", "BUD-001", "BUD-003", "QUE-001", "REQ-004", "CHK-002")
IDIOM = ("SGLang's scheduling parts built on CPU as its unit tests build them (PrefillAdder over a RadixCache, "
         "ReqToTokenPool and TokenToKVPoolAllocator, as test/registered/unit/managers/test_prefill_adder.py "
         "does), with the Scheduler's event-loop glue (get_next_batch_to_run, update_running_batch, the batch "
         "result processor) replayed from managers/scheduler.py")


def prompt_of(request: dict) -> list[int]:
    """The SGLang host's prompt: the trace's ``prompt_tokens``, else ids of its own per request."""
    tokens = request.get("prompt_tokens")
    return list(tokens) if tokens else token_ids(request["id"], request["prompt_len"])


EXPORTERS = (Exporter("sglang", "sglang", PROPERTIES, prompt_of, IDIOM,
                      needs="the installed sglang with torch and transformers; no model, no GPU"),)
