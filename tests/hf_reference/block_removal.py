#!/usr/bin/env python3
"""Block removal recomputed by Hugging Face transformers on an exported (pre-norm) student.

  python3 tests/hf_reference/block_removal.py --model HF_DIR --batch BATCH.txt --block-layers L

BATCH.txt: 2·B lines of whitespace-separated ints: B rows of input ids, then B rows of labels
(already shifted; -1 marks padding), all rows the same length. Prints one JSON object:
  {"full_ce": .., "tokens": n, "blocks": [{"block": b, "ce_without": .., "delta_ce": .., "angle": ..}]}
CE: sum of -log softmax(logits)[label] over labels != -1 divided by their count, from transformers'
logits (its final norm and head). Bypassing block b runs the model with layers [b*L, (b+1)*L) taken
out of model.model.layers. Angle: mean over the same positions of arccos(cos(h_in, h_out))/pi with
h_in the hidden state entering layer b*L and h_out the one leaving layer (b+1)*L-1, read with
forward hooks (transformers' hidden_states output applies the final norm to the last entry).
Used by tests/diagnostics/block_removal_test.cpp against deepen's diagnostics/block_removal.
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM


def read_batch(path):
    with open(path) as f:
        rows = [[int(w) for w in line.split()] for line in f if line.split()]
    half = len(rows) // 2
    return torch.tensor(rows[:half], dtype=torch.long), torch.tensor(rows[half:], dtype=torch.long)


def mean_ce(model, ids, labels):
    logits = model(ids).logits.double()
    keep = labels != -1
    return F.cross_entropy(logits[keep], labels[keep], reduction="sum").item() / keep.sum().item(), int(keep.sum())


def layer_io(model, ids):
    """Hidden state entering and leaving every decoder layer."""
    seen = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        def hook(module, args, kwargs, output, i=i):
            x = args[0] if args else kwargs["hidden_states"]
            y = output[0] if isinstance(output, tuple) else output
            seen[i] = (x.detach().double(), y.detach().double())
        hooks.append(layer.register_forward_hook(hook, with_kwargs=True))
    model(ids)
    for h in hooks:
        h.remove()
    return seen


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--batch", required=True)
    p.add_argument("--block-layers", type=int, required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    ids, labels = read_batch(a.batch)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    model.eval()
    L = a.block_layers
    with torch.no_grad():
        full, tokens = mean_ce(model, ids, labels)
        io = layer_io(model, ids)
        layers = list(model.model.layers)
        keep = labels != -1
        blocks = []
        for b in range(len(layers) // L):
            h_in, h_out = io[b * L][0], io[(b + 1) * L - 1][1]
            cos = F.cosine_similarity(h_in, h_out, dim=-1).clamp(-1, 1)
            angle = (torch.acos(cos) / math.pi)[keep].mean().item()
            model.model.layers = torch.nn.ModuleList(layers[: b * L] + layers[(b + 1) * L :])
            without, _ = mean_ce(model, ids, labels)
            model.model.layers = torch.nn.ModuleList(layers)
            blocks.append({"block": b, "ce_without": without, "delta_ce": without - full, "angle": angle})
    print(json.dumps({"full_ce": full, "tokens": tokens, "blocks": blocks}))


if __name__ == "__main__":
    main()
