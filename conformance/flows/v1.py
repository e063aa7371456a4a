"""vLLM V1's flow: one token budget over running then waiting, chunked prefill, prefix caching."""

from conformance.flows.record import Flow

FLOW = Flow(
    id="v1",
    title="vLLM V1 (token budget, chunked prefill, prefix caching, recompute)",
    reference="reference_impl.v1_scheduler:V1Scheduler",
    traces="conformance.generation.v1:v1_traces",
    configs="conformance.generation.v1:v1_configs",
    profile="vllm-v1",
    invariant_families=("spec.invariants.chunked", "spec.invariants.prefix_cache", "spec.invariants.order"),
    mutants="conformance.selftest.mutants_v1",
    twin="gpu_impl.adapter_v1:make",
    proof_flow="v1",
    proof_encoding="spec.proofs.chunked",
    adapters=("reference-v1", "gpu-v1"),
    targets=("vllm-v1", "aphrodite"),  # Aphrodite's scheduler is vLLM V1's (lockstep_v1 --target aphrodite)
    lockstep="conformance.selftest.campaigns.lockstep_v1:main",
    deviations="conformance.selftest.campaigns.lockstep_v1:CLASSES",
    tests=("tests/test_v1_reference.py", "tests/test_gpu_impl_v1.py", "tests/test_proofs_v1.py",
           "tests/test_proofs_v1_encoding.py", "tests/test_targets_v1_lockstep.py"),
)
