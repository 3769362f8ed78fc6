#!/usr/bin/env python3
"""An independent PyTorch implementation of deepen's student for every norm placement, in float64.

  python3 tests/hf_reference/placement_reference.py CASE_DIR [CASE_DIR ...]

Each CASE_DIR holds what tests/model/placement_reference_test.cpp wrote:
  student.safetensors  a deepen student file (save_student): the weights under their Hugging Face
                       names and, in its metadata, the spec ("student": hidden, heads, norm,
                       mix_post_fraction, max_depth, entry_norm, tie_embeddings, depth, ...)
  inputs.safetensors   "ids" int64 [B, T] and "grad" [B, T, vocab]: the upstream gradient
and gets reference.safetensors: "logits" [B, T, vocab] and "grad.<name>" for every tensor of the
student file, the gradient of sum(logits * grad), all computed in float64 from the weights; and the
same computed in float32 ("fp32.logits", "fp32.grad.<name>"): how far fp32 itself lands from the
float64 values, the rounding floor an fp32 implementation is measured against.

Written from the placements' definitions (docs/model.md#norm-placement), not from deepen's code:
  pre:        h = x + attn(norm1(x));            y = h + mlp(norm2(h))
  post:       h = norm1(x + attn(x));            y = norm2(h + mlp(h))
  peri:       h = x + out1(attn(norm1(x)));      y = h + out2(mlp(norm2(h)))
  mix:        layers [0, ceil(f * max_depth)) post, the rest pre (f = mix_post_fraction)
  pre_scaled: pre with every norm's output times 1 / sqrt(l), l the 1-based layer index
A final norm before the head for every placement but post; post with entry_norm normalizes the
embedding output. RMSNorm(x) = w * x / sqrt(mean(x^2) + eps); attention as Qwen3: q/k/v projections,
RMSNorm of each q and k head, rotary embedding (half-split rotate), grouped KV heads, causal softmax
with scale head_dim^-0.5, o projection; MLP = down(silu(gate(x)) * up(x)).
"""
import json
import math
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

DT = torch.float64


def rms_norm(x, w, eps):
    return w * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotary(t, d, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=DT) / d))
    angles = torch.arange(t, dtype=DT)[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def attention(p, pre, x, s):
    b, t, _ = x.shape
    hq, hk, d = s["heads"], s["kv_heads"], s["head_dim"]

    def proj(name, n):
        y = x @ p[pre + f"self_attn.{name}_proj.weight"].T
        bias = p.get(pre + f"self_attn.{name}_proj.bias")
        if bias is not None:
            y = y + bias
        return y.view(b, t, n, d)

    q = rms_norm(proj("q", hq), p[pre + "self_attn.q_norm.weight"], s["rms_eps"])
    k = rms_norm(proj("k", hk), p[pre + "self_attn.k_norm.weight"], s["rms_eps"])
    v = proj("v", hk)
    cos, sin = rotary(t, d, s["rope_theta"])
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # [b, heads, t, d]
    k = k.repeat_interleave(hq // hk, dim=1)
    v = v.repeat_interleave(hq // hk, dim=1)
    scores = (q @ k.transpose(-1, -2)) * d ** -0.5
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    o = torch.softmax(scores, dim=-1) @ v
    y = o.transpose(1, 2).reshape(b, t, hq * d) @ p[pre + "self_attn.o_proj.weight"].T
    bias = p.get(pre + "self_attn.o_proj.bias")
    return y + bias if bias is not None else y


def mlp(p, pre, x):
    gate = x @ p[pre + "mlp.gate_proj.weight"].T
    up = x @ p[pre + "mlp.up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ p[pre + "mlp.down_proj.weight"].T


def layer_kind(s, i):
    norm = s["norm"]
    if norm == "mix":
        return "post" if i < math.ceil(s["mix_post_fraction"] * s["max_depth"] - 1e-9) else "pre"
    if norm == "pre_scaled":
        return "pre"
    return norm


def layer(p, i, x, s):
    pre = f"model.layers.{i}."
    eps = s["rms_eps"]
    kind = layer_kind(s, i)
    scale = 1.0 / math.sqrt(i + 1) if s["norm"] == "pre_scaled" else 1.0

    def norm(name, y):
        return rms_norm(y, p[pre + name + ".weight"], eps)

    if kind == "pre":
        h = x + attention(p, pre, norm("input_layernorm", x) * scale, s)
        return h + mlp(p, pre, norm("post_attention_layernorm", h) * scale)
    if kind == "post":
        h = norm("input_layernorm", x + attention(p, pre, x, s))
        return norm("post_attention_layernorm", h + mlp(p, pre, h))
    if kind == "peri":
        h = x + norm("attn_output_layernorm", attention(p, pre, norm("input_layernorm", x), s))
        return h + norm("mlp_output_layernorm", mlp(p, pre, norm("post_attention_layernorm", h)))
    raise ValueError(f"unknown placement {kind}")


def logits_of(p, ids, s):
    x = p["model.embed_tokens.weight"][ids]
    if s.get("entry_norm", False):
        x = rms_norm(x, p["model.entry_norm.weight"], s["rms_eps"])
    for i in range(s["depth"]):
        x = layer(p, i, x, s)
    if s["norm"] != "post":
        x = rms_norm(x, p["model.norm.weight"], s["rms_eps"])
    head = p["model.embed_tokens.weight"] if s["tie_embeddings"] else p["lm_head.weight"]
    return x @ head.T


def logits_and_grads(stored, inputs, spec, dtype, prefix):
    global DT
    DT = dtype
    weights = {k: v.to(dtype).requires_grad_(True) for k, v in stored.items()}
    logits = logits_of(weights, inputs["ids"], spec)
    (logits * inputs["grad"].to(dtype)).sum().backward()
    out = {prefix + "logits": logits.detach().contiguous()}
    for name, w in weights.items():
        out[prefix + "grad." + name] = (w.grad if w.grad is not None else torch.zeros_like(w)).detach().contiguous()
    return out


def run_case(case_dir):
    student_path = f"{case_dir}/student.safetensors"
    with safe_open(student_path, framework="pt") as f:
        spec = json.loads(f.metadata()["student"])
    stored = load_file(student_path)
    inputs = load_file(f"{case_dir}/inputs.safetensors")
    out = logits_and_grads(stored, inputs, spec, torch.float64, "")
    out.update(logits_and_grads(stored, inputs, spec, torch.float32, "fp32."))
    save_file(out, f"{case_dir}/reference.safetensors")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for case_dir in sys.argv[1:]:
        run_case(case_dir)


if __name__ == "__main__":
    main()
