"""Targets kvsched drives that have no standalone export, each with its reason in one line."""

UNSUPPORTED: dict[str, str] = {
    "sglang": "SGLang's Scheduler cannot be built without a TP worker and a model, and its tests run whole servers; "
              "kvsched's host replays Scheduler glue (conformance/targets/hosts/sglang_host.py), so a standalone "
              "file would be kvsched's harness, not SGLang's idiom. Replay with `kvsched replay TRACE --adapter "
              "sglang`.",
    "aphrodite": "not yet: Aphrodite 0.24.1's scheduler is vLLM V1's under another package name, and kvsched found no "
                 "defect in it (its lockstep classes are deviations, docs/CONFORMANCE.md); the vllm-v1 exporter would "
                 "serve with Aphrodite's module names.",
}
