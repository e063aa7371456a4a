"""vLLM V1's flow over hybrid KV cache groups: sliding window, chunked local attention, Mamba state
and shared layers beside full attention, all in one block pool (spec/kv_groups.py, docs/HYBRID.md).

Its own record rather than a knob on the v1 record: its configs carry the group layout, its
traces reach the hybrid manager's paths (window freeing, state blocks, aligned chunks, hits every
group must serve), its profile claims HYB-004/005, and its mutants break those paths, none of
which the V1 flow's one-group traces would reach. With one group it is the V1 flow."""

from conformance.flows.record import Flow

FLOW = Flow(
    id="hybrid",
    title="vLLM V1 with hybrid KV cache groups (sliding window, chunked local, Mamba, shared)",
    reference="reference_impl.hybrid_scheduler:HybridV1Scheduler",
    traces="conformance.generation.hybrid:hybrid_flow_traces",
    configs="conformance.generation.hybrid:hybrid_flow_configs",
    profile="hybrid",
    invariant_families=("spec.invariants.groups",),
    mutants="conformance.selftest.mutants_hybrid",
    targets=(),
    tests=("tests/test_hybrid_reference.py", "tests/test_hybrid_mutants.py"),
)
