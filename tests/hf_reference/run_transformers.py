#!/usr/bin/env python3
"""Reference logits from Hugging Face transformers, in the format `deepen forward` writes.

  python3 tests/hf_reference/run_transformers.py --model DIR --ids IDS.txt --out LOGITS.safetensors

IDS.txt: whitespace-separated token ids, one sequence per line. Each line runs alone (batch 1, no
padding), in fp32 (or --dtype bf16) with transformers' default attention; the output holds F32
"logits.<i>" [T_i, vocab].
Used by make_tiny_qwen3.py (fixtures) and by the export round-trip test.
"""
import argparse

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM


def read_ids(path):
    with open(path) as f:
        return [[int(w) for w in line.split()] for line in f if line.split()]


def reference_logits(model_dir, sequences, dtype=torch.float32):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model.eval()
    out = {}
    with torch.no_grad():
        for i, ids in enumerate(sequences):
            logits = model(torch.tensor([ids], dtype=torch.long)).logits[0]
            out[f"logits.{i}"] = logits.float().contiguous()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--ids", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    a = p.parse_args()
    torch.set_num_threads(1)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    save_file(reference_logits(a.model, read_ids(a.ids), dtype), a.out)


if __name__ == "__main__":
    main()
