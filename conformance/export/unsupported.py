"""Targets kvsched drives that have no standalone export, each with its reason in one line."""

UNSUPPORTED: dict[str, str] = {
    "aphrodite": "not yet: Aphrodite 0.24.1's scheduler is vLLM V1's under another package name, and kvsched found no "
                 "defect in it (its lockstep classes are deviations, docs/CONFORMANCE.md); the vllm-v1 exporter would "
                 "serve with Aphrodite's module names.",
}
