"""Export to vllm_v0 (to come)."""

EXPORTERS = ()
