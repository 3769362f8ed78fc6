#!/usr/bin/env python3
"""A random Qwen3 checkpoint in Hugging Face format (config.json + model.safetensors, bf16) at any shape.

  python3 scripts/random_qwen3.py OUT --layers 4 --hidden 4096 --heads 32 --kv-heads 8 --head-dim 128 \
      --intermediate 12288 --vocab 151936

What `deepen train` loads as teacher.checkpoint, for timing runs at a real teacher's width without
its weights (scripts/device_check.sh). Weights have std 1/sqrt(fan_in), so activations stay of order
one through the layers; norms are ones. Generated on the GPU when there is one (seconds for 2e9).
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    for name, default in [("layers", 4), ("hidden", 4096), ("heads", 32), ("kv-heads", 8), ("head-dim", 128),
                          ("intermediate", 12288), ("vocab", 151936), ("seed", 0)]:
        ap.add_argument("--" + name, type=int, default=default)
    a = ap.parse_args()
    h, heads, kv, hd = a.hidden, a.heads, a.kv_heads, a.head_dim
    os.makedirs(a.out, exist_ok=True)
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": h,
              "num_hidden_layers": a.layers, "num_attention_heads": heads, "num_key_value_heads": kv,
              "head_dim": hd, "intermediate_size": a.intermediate, "vocab_size": a.vocab, "rms_norm_eps": 1e-6,
              "rope_theta": 1e6, "max_position_embeddings": 40960, "tie_word_embeddings": False,
              "attention_bias": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(a.seed)

    def w(rows, cols):
        return (torch.randn(rows, cols, generator=g, device=dev) / cols ** 0.5).to(torch.bfloat16).cpu()

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    t = {"model.embed_tokens.weight": w(a.vocab, h), "model.norm.weight": ones(h), "lm_head.weight": w(a.vocab, h)}
    for i in range(a.layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = w(heads * hd, h)
        t[p + "self_attn.k_proj.weight"] = w(kv * hd, h)
        t[p + "self_attn.v_proj.weight"] = w(kv * hd, h)
        t[p + "self_attn.o_proj.weight"] = w(h, heads * hd)
        t[p + "self_attn.q_norm.weight"] = ones(hd)
        t[p + "self_attn.k_norm.weight"] = ones(hd)
        t[p + "input_layernorm.weight"] = ones(h)
        t[p + "post_attention_layernorm.weight"] = ones(h)
        t[p + "mlp.gate_proj.weight"] = w(a.intermediate, h)
        t[p + "mlp.up_proj.weight"] = w(a.intermediate, h)
        t[p + "mlp.down_proj.weight"] = w(h, a.intermediate)
    save_file(t, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    print(f"{a.out}: {sum(x.numel() for x in t.values()) / 1e9:.3f}e9 parameters, bf16")


if __name__ == "__main__":
    main()
