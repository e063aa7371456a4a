"""Trace generation: Hypothesis strategies for configs and traces, one module per flow family.

`v0` (vLLM V0's corners: swaps, forks, watermarks), `v1` (token budgets, chunked prefill, prefix
caching; also nano-vllm's), `specdec` (drafts), `async_paths` (pipelined steps), `sglang` (SGLang's
scheduler), and `domain` (traces inside the config domain an adapter declares).
"""
