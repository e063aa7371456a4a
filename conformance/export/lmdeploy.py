"""Export to LMDeploy's PyTorch engine (``lmdeploy``: lmdeploy==0.18.0), in the idiom of LMDeploy's
tests/pytorch/paging/test_scheduler.py: a ``Scheduler`` from ``SchedulerConfig``, ``CacheConfig``
and ``SequenceMeta(block_size, strategy=ARSequenceStrategy())``, sequences added through
``add_session(...).add_sequence(token_ids)``, ``schedule(is_prefill=...)`` and
``update_token_ids``. The step around it is the engine's (inputs_maker.py, engine_loop.py), as
conformance/targets/hosts/lmdeploy_host.py replays it: the same door, token ids and stop rule.

LMDeploy has no defect finding (its findings are deviations by design, docs/CONFORMANCE.md); its
exported files are the deviation traces, which fail on the release, as the both-ways record says.
"""

from __future__ import annotations

from conformance.export.record import Exporter, token_ids

PROPERTIES = ("FAULT-raised", "LIV-001", "BUD-001", "BUD-003", "QUE-001", "REQ-004", "RES-003", "CHK-002")
IDIOM = ("LMDeploy's paging Scheduler built as tests/pytorch/paging/test_scheduler.py's fixtures build it "
         "(SchedulerConfig, CacheConfig, SequenceMeta with ARSequenceStrategy; add_session().add_sequence()), "
         "stepped as the PyTorch engine's inputs maker and engine loop step it (prefill or schedule_running, "
         "activate_seqs, preempt_seqs, update_token_ids)")


def prompt_of(request: dict) -> list[int]:
    """The LMDeploy host's prompt: the trace's ``prompt_tokens``, else ids of its own per request."""
    tokens = request.get("prompt_tokens")
    return list(tokens) if tokens else token_ids(request["id"], request["prompt_len"])


EXPORTERS = (Exporter("lmdeploy", "lmdeploy", PROPERTIES, prompt_of, IDIOM,
                      needs="the installed lmdeploy with torch and numpy; no model, no GPU"),)
