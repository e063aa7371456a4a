"""The lockstep references stand behind vLLM V1's front door (conformance/selftest/campaigns/door.py): a
generate prompt of exactly max_model_len tokens is refused on arrival, as vLLM 0.33.0's input
processor and the V1 hosts refuse it, so a campaign compares such a trace to its end instead of
diverging at step 0. Runs without any target installed; the target side is pinned in
tests/test_host_fidelity.py and tests/test_targets_v1_lockstep.py."""

from __future__ import annotations

import dataclasses

import pytest

from conformance.selftest.campaigns.campaign_args import keep_other_paths
from conformance.selftest.campaigns.lockstep_async import RecordingAsync
from conformance.selftest.campaigns.lockstep_specdec import RecordingAsyncSpec, RecordingSpec
from conformance.selftest.campaigns.lockstep_v1 import RecordingV1
from reference_impl.v1_scheduler import V1Scheduler
from spec.config import SchedulerConfig
from spec.status import Status
from spec.types import Request, StepOutcome

CONFIG = SchedulerConfig(block_size=2, num_gpu_blocks=8, num_cpu_blocks=0, max_num_seqs=2, max_num_batched_tokens=16,
                         max_model_len=8, watermark=0.0, preemption_mode="recompute")
REFERENCES = {"v1": (RecordingV1, CONFIG), "async": (RecordingAsync, CONFIG),
              "specdec": (RecordingSpec, dataclasses.replace(CONFIG, num_speculative_tokens=2)),
              "specdec-async": (RecordingAsyncSpec, dataclasses.replace(CONFIG, num_speculative_tokens=2))}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_a_prompt_of_max_model_len_is_refused_on_arrival(name):
    cls, config = REFERENCES[name]
    ref = cls(config)
    ref.add_request(Request("at", 8, 3))
    ref.add_request(Request("below", 7, 3))
    output = ref.schedule()
    assert output.ignored == ("at",)
    assert [s.request_id for s in output.scheduled] == ["below"]
    finished = ref.update(StepOutcome(frozenset()))
    assert [(f.request_id, f.status) for f in finished if f.request_id == "at"] == [("at", Status.FINISHED_IGNORED)]
    assert ref.abort_request("at") is None  # nothing to abort, as on the host


def test_the_spec_reference_still_runs_such_a_prompt():
    """The door is the campaign's, not the spec's: the plain reference runs a prompt of
    max_model_len and caps it after one token (a spec decision, vLLM V0's behaviour)."""
    ref = V1Scheduler(CONFIG)
    ref.add_request(Request("at", 8, 3))
    output = ref.schedule()
    assert not output.ignored and [s.request_id for s in output.scheduled] == ["at"]
    finished = ref.update(StepOutcome(frozenset()))
    assert [(f.request_id, f.status) for f in finished] == [("at", Status.FINISHED_LENGTH_CAPPED)]


def test_a_rerun_drops_the_classes_only_its_paths_had():
    old = {"paths": {"a": {"traces": 1}, "b": {"traces": 2}},
           "classes": {"gone": {"kind": "k", "paths": {"a": {}}}, "kept": {"kind": "k", "paths": {"a": {}, "b": {}}}}}
    report: dict = {"paths": {}, "classes": {}}
    keep_other_paths(report, old, ("a",))
    assert report == {"paths": {"b": {"traces": 2}}, "classes": {"kept": {"kind": "k", "paths": {"b": {}}}}}
