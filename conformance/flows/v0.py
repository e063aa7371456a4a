"""vLLM V0's flow: sequence groups, waiting/running/swapped queues, swap or recompute."""

from conformance.flows.record import Flow

FLOW = Flow(
    id="v0",
    title="vLLM V0 (groups, swap or recompute, no chunked prefill)",
    reference="reference_impl.scheduler:Scheduler",
    traces="conformance.generation.v0:traces",
    configs="conformance.generation.v0:configs",
    profile="vllm-v0",
    invariant_families=("spec.invariants.blocks", "spec.invariants.swap", "spec.invariants.admission",
                        "spec.invariants.budgets", "spec.invariants.placement", "spec.invariants.requests",
                        "spec.invariants.policy", "spec.invariants.liveness"),
    mutants="conformance.selftest.mutants",
    twin="gpu_impl.adapter:make",
    proof_flow="v0",
    proof_encoding="spec.proofs.encoding",
    adapters=("reference", "gpu"),
    targets=("vllm-v0",),
    lockstep="conformance.selftest.campaigns.campaign:main",
    deviations="conformance.selftest.campaigns.campaign:CLASSES",
    tests=("tests/test_spec.py", "tests/test_mutants.py", "tests/test_gpu_impl_lockstep.py", "tests/test_proofs.py",
           "tests/test_targets.py"),
)
