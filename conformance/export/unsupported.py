"""Targets kvsched drives that have no standalone export, each with its reason in one line."""

UNSUPPORTED: dict[str, str] = {
    "vllm-v1-async-0.29": "not yet: vLLM 0.29.0 is kept only to replay vllm-project/vllm#57562 on the release it was "
                          "reported on, and kvsched found no defect of its own in it; the vllm-v1-async exporter is "
                          "written against 0.33.0's Scheduler API. Replay with `kvsched replay TRACE --adapter "
                          "vllm-v1-async-0.29`.",
}
