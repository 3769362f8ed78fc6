// TeacherStage: builds empty modules for a layer range and fills them from the checkpoint.
#include "model/teacher_stage.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "config/input_error.h"
#include "model/hf_names.h"
#include "model/safetensors.h"
#include "model/tensor_bridge.h"

namespace deepen {
namespace {

// Copies one checked checkpoint tensor into a module parameter (cast to its dtype and device).
void fill(at::Tensor& param, const SafetensorsCheckpoint& ckpt, const ExpectedTensor& expected,
          std::vector<std::string>& loaded) {
  check_expected_tensor(ckpt, expected);  // shape against the config, floating dtype
  at::NoGradGuard no_grad;
  param.copy_(checkpoint_tensor(ckpt, expected.name));
  loaded.push_back(expected.name);
}

}  // namespace

TeacherStage::TeacherStage(const std::string& dir, int first, int last, bool is_first, bool is_last,
                           at::ScalarType dtype, at::Device device, CpuKernels kernels, bool with_head)
    : first_(first), last_(last), is_first_(is_first), is_last_(is_last), with_head_(with_head), dtype_(dtype),
      device_(device) {
  config_ = read_qwen3_config(dir + "/config.json");
  spec_ = decoder_spec_from(config_);
  spec_.cpu_kernels = kernels;
  const int n = static_cast<int>(config_.num_hidden_layers);
  const std::string range = dir + ": teacher stage [" + std::to_string(first) + ", " +
                            std::to_string(last) + ")";
  if (first < 0 || first >= last || last > n)
    throw InputError(range + ": need 0 <= first < last <= num_hidden_layers = " + std::to_string(n));
  if (is_first != (first == 0))
    throw InputError(range + ": the embedding belongs to the stage that starts at layer 0");
  if (is_last != (last == n))
    throw InputError(range + ": the head belongs to the stage that ends at layer " + std::to_string(n));
  if (dtype != at::kFloat && dtype != at::kBFloat16)
    throw InputError(range + ": compute dtype must be fp32 or bf16");

  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir);
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  if (is_first) {
    const ExpectedTensor e = expected_embedding(config_);
    embed_tokens_ = register_module("embed_tokens", Embedding(config_.vocab_size, spec_.hidden, options));
    fill(embed_tokens_->weight, ckpt, e, loaded_);
  }
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (int layer = first; layer < last; ++layer) {
    DecoderBlock block(spec_, LayerNorms::kPre, options);  // Qwen3: pre-norm
    auto params = block->named_parameters();
    const std::vector<ExpectedTensor> expected = expected_layer_tensors(config_, layer);
    if (expected.size() != params.size())
      throw std::logic_error("TeacherStage: block has " + std::to_string(params.size()) +
                             " parameters, the HF table lists " + std::to_string(expected.size()));
    for (const ExpectedTensor& e : expected) {
      at::Tensor* p = params.find(e.part);
      if (p == nullptr) throw std::logic_error("TeacherStage: no block parameter named " + e.part);
      fill(*p, ckpt, e, loaded_);
    }
    layers_->push_back(block);
  }
  if (is_last) {
    norm_ = register_module("norm", RMSNorm(spec_.hidden, spec_.rms_eps, options, spec_.cpu_kernels));
    fill(norm_->weight, ckpt, expected_final_norm(config_), loaded_);
    const std::optional<ExpectedTensor> head = expected_head(config_);
    if (!with_head) {
      // The students make the logits from the hidden states this stage returns.
    } else if (!head && is_first) {
      head_weight_ = embed_tokens_->weight;  // tied, and this stage holds the embedding already
    } else {
      // Untied: lm_head.weight. Tied on a later stage: its own copy of the embedding matrix.
      lm_head_ = register_module("lm_head", Projection(spec_.hidden, config_.vocab_size, false, options));
      fill(lm_head_->weight, ckpt, head ? *head : expected_embedding(config_), loaded_);
      head_weight_ = lm_head_->weight;
    }
  }
  opened_files_ = ckpt.opened_files();
  for (auto& p : parameters()) p.set_requires_grad(false);
  eval();
}

at::Tensor TeacherStage::body(const at::Tensor& input) {
  at::Tensor x;
  if (is_first_) {
    if (input.dim() != 2 || input.scalar_type() != at::kLong)
      throw std::invalid_argument("TeacherStage stage 0: expected ids [B, T] int64");
    x = embed_tokens_(input.to(device_));
  } else {
    if (input.dim() != 3 || input.size(2) != spec_.hidden)
      throw std::invalid_argument("TeacherStage: expected hidden [B, T, " + std::to_string(spec_.hidden) + "]");
    x = input.to(device_, dtype_);
  }
  const Rotary rope = make_rotary(x.size(1), spec_.head_dim, spec_.rope_theta, dtype_, device_);
  for (size_t j = 0; j < layers_->size(); ++j) x = layers_->ptr<DecoderBlockImpl>(j)->forward(x, rope);
  return is_last_ ? norm_(x) : x;
}

at::Tensor TeacherStage::forward(const at::Tensor& input) {
  at::NoGradGuard no_grad;
  const at::Tensor x = body(input);
  if (!is_last_ || !with_head_) return x;
  at::Tensor logits = at::empty({x.size(0), x.size(1), config_.vocab_size}, at::TensorOptions().dtype(dtype_).device(device_));
  head_into(x, logits.view({-1, config_.vocab_size}));
  return logits;
}

at::Tensor TeacherStage::final_hidden(const at::Tensor& input) {
  if (!is_last_) throw std::logic_error("TeacherStage::final_hidden: not the last stage");
  at::NoGradGuard no_grad;
  return body(input);
}

int64_t TeacherStage::head_rows() const {
  return std::max<int64_t>(1, (int64_t{64} << 20) / (4 * std::max<int64_t>(1, config_.vocab_size)));
}

void TeacherStage::head_into(const at::Tensor& hidden, const at::Tensor& out) const {
  if (!is_last_ || !with_head_ || !head_weight_.defined())
    throw std::logic_error("TeacherStage::head_into: this stage has no head");
  at::NoGradGuard no_grad;
  const at::Tensor rows = hidden.reshape({-1, spec_.hidden});
  const int64_t n = rows.size(0);
  if (out.dim() != 2 || out.size(0) != n || out.size(1) != config_.vocab_size || !out.is_contiguous())
    throw std::invalid_argument("TeacherStage::head_into: expected a contiguous [" + std::to_string(n) + ", " +
                                std::to_string(config_.vocab_size) + "] output");
  const bool in_place = out.scalar_type() == dtype_ && out.device() == device_;
  if (in_place) {
    // No temporary to bound: one GEMM, which packs the [vocab, hidden] weight once instead of once
    // per chunk (on 2 CPU cores, chunks of 110 rows ran the head at 0.6x the one GEMM's rate).
    at::Tensor dst = out;
    at::mm_out(dst, rows.to(device_, dtype_), head_weight_.t());
    return;
  }
  const int64_t step = head_rows();
  for (int64_t r0 = 0; r0 < n; r0 += step) {
    const int64_t r = std::min(step, n - r0);
    const at::Tensor x = rows.narrow(0, r0, r).to(device_, dtype_);
    at::Tensor dst = out.narrow(0, r0, r);
    if (in_place) at::mm_out(dst, x, head_weight_.t());
    else dst.copy_(at::mm(x, head_weight_.t()));
  }
}

at::Tensor load_teacher_head(const std::string& dir, at::ScalarType dtype, at::Device device) {
  const Qwen3Config config = read_qwen3_config(dir + "/config.json");
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir);
  // Tied (no lm_head.weight): the head is the embedding matrix.
  const ExpectedTensor e = expected_head(config).value_or(expected_embedding(config));
  at::Tensor head = at::empty({config.vocab_size, config.hidden_size}, at::TensorOptions().dtype(dtype).device(device));
  std::vector<std::string> loaded;
  fill(head, ckpt, e, loaded);
  return head;
}

}  // namespace deepen
