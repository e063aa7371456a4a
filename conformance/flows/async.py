"""vLLM V1's flow with pipelined steps (``AsyncScheduler``): a step's outcome arrives
``pipeline_depth`` steps after it was scheduled. docs/ASYNC.md is the design.

(The file is named by the flow id; ``async`` is a Python keyword, so the registry imports it with
`importlib`.)"""

from conformance.flows.record import Flow

FLOW = Flow(
    id="async",
    title="vLLM V1 pipelined (AsyncScheduler: outcomes one step late)",
    reference="reference_impl.async_scheduler:AsyncV1Scheduler",
    traces="conformance.generation.async_paths:all_paths_strategy",
    configs="conformance.generation.async_paths:all_paths_configs",
    profile="async",
    invariant_families=("spec.invariants.async",),
    mutants="conformance.selftest.mutants_async",
    proof_flow="async",
    proof_encoding="spec.proofs.encoding_async",
    adapters=("reference-async",),
    targets=("vllm-v1-async", "vllm-v1-async-0.29"),
    lockstep="conformance.selftest.campaigns.lockstep_async:main",
    deviations="conformance.selftest.campaigns.lockstep_async:CLASSES",
    tests=("tests/test_async_reference.py", "tests/test_async_mutants.py", "tests/test_async_target.py",
           "tests/test_async_proofs.py", "tests/test_async_encoding_matches_reference.py",
           "tests/test_async_in_flight.py", "tests/test_async_hunt.py"),
    extra={"checks": "conformance.selftest.async_checks:problems",
           "safety_gaps": "conformance.selftest.async_safety_gaps:main",
           "deferred_free_reference": "reference_impl.async_scheduler:DeferredFreeAsyncV1Scheduler",
           "hunt": "conformance.selftest.campaigns.async_hunt:main",
           "probe_57562": "conformance.selftest.campaigns.async_probe:main"},
)
