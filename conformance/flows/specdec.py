"""vLLM V1's flow with speculative decoding: draft tokens scheduled with a decode, verified and
rolled back (spec/speculative.py, docs/SPECDEC.md). Synchronous here; with outcomes in flight the
async flow's reference runs it (``pipeline_depth`` > 0 and k > 0 in one config).

Its own record rather than a knob on the v1 record: its traces carry the drafter's and the model's
decisions, its profile claims SPD-004, and its mutants break the draft path, none of which the
V1 flow's traces would reach."""

from conformance.flows.record import Flow

FLOW = Flow(
    id="specdec",
    title="vLLM V1 with speculative decoding (drafts scheduled, verified, rolled back)",
    reference="reference_impl.specdec_scheduler:SpecDecScheduler",
    traces="conformance.generation.specdec:specdec_traces",
    configs="conformance.generation.specdec:specdec_configs",
    profile="specdec",
    invariant_families=("spec.invariants.specdec",),
    mutants="conformance.selftest.mutants_specdec",
    proof_flow="specdec",
    proof_encoding="spec.proofs.encoding_specdec",
    adapters=("reference-specdec",),
    # vLLM 0.33.0 with k > 0 through the same hosts (the config turns it on): docs/SPECDEC.md
    targets=("vllm-v1", "vllm-v1-async"),
    lockstep="conformance.selftest.campaigns.lockstep_specdec:main",
    deviations="conformance.selftest.campaigns.lockstep_specdec:CLASSES",
    tests=("tests/test_specdec_reference.py", "tests/test_specdec_target.py", "tests/test_specdec_proofs.py",
           "tests/test_specdec_encoding_matches_reference.py"),
    extra={"hunt": "conformance.selftest.campaigns.specdec_hunt:main"},
)
