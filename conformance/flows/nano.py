"""nano-vllm's flow: prefill-only or decode-only steps, whole-prompt admission, prefix caching."""

from conformance.flows.record import Flow

FLOW = Flow(
    id="nano",
    title="nano-vllm (prefill steps or decode steps, prefix caching, recompute)",
    reference="reference_impl.nano_scheduler:NanoScheduler",
    traces="conformance.generation.v1:nano_traces",
    configs="conformance.generation.v1:nano_configs",
    profile="nano-vllm",
    invariant_families=("spec.invariants.prefix_cache",),
    mutants="conformance.selftest.mutants_v1",
    adapters=("reference-nano",),
    targets=("nano-vllm", "nano-vllm-fork"),
    lockstep="conformance.selftest.campaigns.lockstep_nano:main",
    deviations="conformance.selftest.campaigns.lockstep_nano:CLASSES",
    tests=("tests/test_nano_reference.py", "tests/test_targets_nano_lockstep.py"),
)
