"""vLLM V1's flow with pipelined steps (``AsyncScheduler``): a step's outcome arrives
``pipeline_depth`` steps after it was scheduled. docs/PIPELINED.md is the design.

(The file is named by the flow id; ``async`` is a Python keyword, so the registry imports it with
`importlib`.)"""

from conformance.flows.record import Flow

FLOW = Flow(
    id="async",
    title="vLLM V1 pipelined (AsyncScheduler: outcomes one step late)",
    reference="reference_impl.pipelined_scheduler:PipelinedV1Scheduler",
    traces="conformance.targets.pipelined_one_behind:all_paths_strategy",
    profile="safety",
    mutants="conformance.mutants_pipelined",
    targets=(),
    lockstep="conformance.targets.pipelined_one_behind:main",
    deviations="conformance.targets.pipelined_one_behind:CLASSES",
    tests=("tests/test_pipelined_reference.py", "tests/test_pipelined_mutants.py", "tests/test_pipelined_target.py"),
    extra={"checks": "conformance.pipelined_checks:problems",
           "safety_gaps": "conformance.pipelined_safety_gaps:main"},
)
