#!/usr/bin/env python3
"""Tiny random Qwen3 checkpoints made with transformers, with reference logits, for deepen's tests.

  python3 tests/hf_reference/make_tiny_qwen3.py --out build/hf_fixtures

writes, for each case below, OUT/<case>/{config.json, model.safetensors (or shards + index),
ids.txt, reference.safetensors, reference_bf16.safetensors}. reference.safetensors holds
transformers' fp32 logits "logits.<i>" [T_i, vocab] for line i of ids.txt (each line run alone), as
`deepen forward` writes them; reference_bf16 the same with the model in bf16 (stored as F32). The tests
(tests/model/qwen3_hf_test.cpp) run this script themselves into the build folder; everything is
seeded, so the output is the same on every run. Writes into OUT.tmp.<pid> and renames it to OUT,
so concurrent test processes never see a half-written folder.
"""
import argparse
import os
import shutil

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

import run_transformers

# Each case covers a shape feature the issue names: tied/untied head, GQA ratio 1 and > 1,
# head_dim != hidden / heads, 2+ layers, non-default rope_theta, attention biases, sharded files.
CASES = {
    # tied head, GQA 4:2, head_dim 16 != 32/4, 2 layers, theta 10000 (transformers' default)
    "tied_gqa": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, rope_theta=10000.0),
    # untied head, no GQA (4:4), head_dim == hidden/heads, 3 layers, theta 1e6 (Qwen3's own)
    "untied_mha": dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=4, head_dim=8, tie_word_embeddings=False, rope_theta=1e6),
    # untied, GQA 6:2, head_dim 12 != 48/6, non-default theta, eps 1e-5, split over 5 shards
    "untied_gqa_sharded": dict(hidden_size=48, intermediate_size=80, num_hidden_layers=5,
                               num_attention_heads=6, num_key_value_heads=2, head_dim=12,
                               tie_word_embeddings=False, rope_theta=123456.0, rms_norm_eps=1e-5,
                               shard="40KB"),
    # attention biases (Qwen3 supports attention_bias=True), tied, GQA 4:1
    "bias_gqa4": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=1, head_dim=8, tie_word_embeddings=True, rope_theta=50000.0,
                      attention_bias=True),
}
VOCAB = 97
SEQ_LENS = (7, 12, 1)  # a 1-token line checks the non-causal path


def make_case(out_dir, name, spec, seed):
    spec = dict(spec)
    shard = spec.pop("shard", None)
    theta = spec.pop("rope_theta")
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=VOCAB, max_position_embeddings=64,
                         rope_parameters={"rope_type": "default", "rope_theta": theta}, **spec)
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    # HF's init (std 0.02, unit norms) gives logits of ~0.1, against which 1e-4 is lenient. Weights
    # of std 1/sqrt(fan_in), embeddings of std 2/sqrt(hidden) and randomized norm gains give O(1) activations
    # and logits, so a misplaced norm, a wrong RoPE convention or scale shows up far above 1e-4.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif n.endswith("embed_tokens.weight"):  # std 2/sqrt(hidden): tied logits of std ~2
                p.copy_(torch.randn_like(p) * 2 / p.shape[1] ** 0.5)
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    d = os.path.join(out_dir, name)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(d, safe_serialization=True, **kwargs)
    g = torch.Generator().manual_seed(seed + 1)
    sequences = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in SEQ_LENS]
    with open(os.path.join(d, "ids.txt"), "w") as f:
        for ids in sequences:
            f.write(" ".join(map(str, ids)) + "\n")
    from safetensors.torch import save_file
    save_file(run_transformers.reference_logits(d, sequences), os.path.join(d, "reference.safetensors"))
    save_file(run_transformers.reference_logits(d, sequences, torch.bfloat16),
              os.path.join(d, "reference_bf16.safetensors"))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    tmp = f"{a.out}.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for i, (name, spec) in enumerate(CASES.items()):
        make_case(tmp, name, spec, seed=1000 + i)
    try:
        os.rename(tmp, a.out)
    except OSError:  # another process finished first: its identical output stays
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(a.out):
            raise


if __name__ == "__main__":
    main()
