"""Export to nano_vllm (to come)."""

EXPORTERS = ()
