"""SGLang's flow (SGLang 0.5.23): page size 1, a radix cache, prefill steps first with admission
sized by the new-token ratio, the fcfs or lpm waiting order, decode retraction of the fewest
generated tokens first (reference_impl/sglang_scheduler.py has the steps and SGLang's lines)."""

from conformance.flows.record import Flow

FLOW = Flow(
    id="sglang",
    title="SGLang (radix cache, new-token-ratio admission, fcfs/lpm, retract_decode)",
    reference="reference_impl.sglang_scheduler:SglangScheduler",
    traces="conformance.generation.sglang:sglang_traces_any",
    configs="conformance.generation.sglang:sglang_configs_any",
    profile="sglang",
    invariant_families=("spec.invariants.sglang",),
    mutants="conformance.selftest.mutants_sglang",
    adapters=("reference-sglang",),
    targets=("sglang",),
    lockstep="conformance.selftest.campaigns.lockstep_sglang:main",
    deviations="conformance.selftest.campaigns.lockstep_sglang:CLASSES",
    tests=("tests/test_sglang_reference.py", "tests/test_sglang_lockstep.py", "tests/test_sglang_lora.py"),
    extra={"radix_cache": "reference_impl.radix_cache:RadixCache"},
)
