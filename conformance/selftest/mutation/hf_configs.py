"""Model configs for vLLM's tests, written into an offline Hugging Face cache (no weights).

vLLM's ``tests/v1/core`` build a ``ModelConfig`` for a hub model (``facebook/opt-125m`` in most of
``test_scheduler.py``); ModelConfig reads only the model's ``config.json`` (with
``skip_tokenizer_init``). Nothing outside is reachable here, so without these files 400 of the
tests fail before they reach the scheduler. Each config below carries the fields of the model's
published ``config.json`` that vLLM reads (architecture, sizes, context length, dtype).
Multimodal models (llava, Qwen2.5-VL) are left out: their tests exercise the encoder cache,
outside kvsched's scope.
"""

from __future__ import annotations

import json
from pathlib import Path

REVISION = "0" * 40  # a fixed snapshot name; refs/main points at it
CONFIGS: dict[str, dict] = {
    "facebook/opt-125m": {
        "architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 768, "ffn_dim": 3072,
        "num_attention_heads": 12, "num_hidden_layers": 12, "vocab_size": 50272, "max_position_embeddings": 2048,
        "word_embed_proj_dim": 768, "do_layer_norm_before": True, "activation_function": "relu",
        "torch_dtype": "float16", "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2, "enable_bias": True,
        "dropout": 0.1, "attention_dropout": 0.0, "init_std": 0.02, "layerdrop": 0.0, "use_cache": True,
    },
    "Qwen/Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 28,
        "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "torch_dtype": "bfloat16", "tie_word_embeddings": True, "bos_token_id": 151643, "eos_token_id": 151645,
        "hidden_act": "silu", "attention_bias": False, "use_sliding_window": False, "max_window_layers": 28,
    },
    "hmellor/tiny-random-LlamaForCausalLM": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 32000,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "torch_dtype": "float32", "bos_token_id": 1,
        "eos_token_id": 2,
    },
}


def write_cache(hf_home: Path) -> Path:
    """Lay the configs out as huggingface_hub's cache does (``hub/models--org--name``)."""
    for repo, config in CONFIGS.items():
        base = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
        snapshot = base / "snapshots" / REVISION
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(json.dumps(config, indent=1) + "\n")
        (base / "refs").mkdir(exist_ok=True)
        (base / "refs" / "main").write_text(REVISION)
    return hf_home
