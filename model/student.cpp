// GrowableStudent: construction, deterministic init, growth, freezing, checksum and forward paths.
#include "model/student.h"
#include "model/torch_dtype.h"

#include <cstring>
#include <functional>
#include <string_view>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "config/config.h"
#include "config/input_error.h"

namespace deepen {
namespace {

// splitmix64: decorrelates (seed, tag) pairs so that neighbouring seeds or block indices give
// unrelated generator streams.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Tags of the things drawn from the seed; block i uses kBlockTag + i.
constexpr uint64_t kEmbedTag = 1;
constexpr uint64_t kHeadTag = 2;
constexpr uint64_t kBlockTag = 1000;

at::Generator generator_for(uint64_t seed, uint64_t tag) {
  return at::make_generator<at::CPUGeneratorImpl>(mix64(seed ^ mix64(tag)));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// HF's _init_weights for Qwen3: Linear/Embedding weights ~ normal(0, initializer_range = 0.02),
// biases 0, RMSNorm weights 1. Parameters are visited in named_parameters() order, so the draw
// is a pure function of the generator's seed and the module's shapes.
void init_like_hf(torch::nn::Module& module, at::Generator gen) {
  at::NoGradGuard no_grad;
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    at::Tensor p = item.value();
    if (ends_with(item.key(), "norm.weight")) {
      p.fill_(1.0);
    } else if (ends_with(item.key(), "bias")) {
      p.zero_();
    } else {
      p.normal_(0.0, 0.02, gen);
    }
  }
}

}  // namespace

StudentSpec student_spec_from_config(const StudentConfig& cfg, int64_t vocab_size) {
  StudentSpec spec;
  spec.decoder.hidden = cfg.hidden;
  spec.decoder.heads = cfg.heads;
  spec.decoder.kv_heads = cfg.kv_heads;
  spec.decoder.head_dim = cfg.head_dim;
  spec.decoder.intermediate = cfg.intermediate;
  spec.decoder.rope_theta = cfg.rope_theta;
  spec.decoder.rms_eps = cfg.rms_eps;
  spec.decoder.cpu_kernels = cfg.cpu_kernels;
  spec.decoder.recompute = cfg.recompute;
  validate_decoder_spec(spec.decoder, "student");
  if (vocab_size <= 0) throw InputError("student.vocab_size: must be positive, got " + std::to_string(vocab_size));
  if (cfg.layers <= 0) throw InputError("student.layers: must be positive, got " + std::to_string(cfg.layers));
  spec.vocab_size = vocab_size;
  spec.max_depth = cfg.layers;
  spec.norm = cfg.norm;
  spec.mix_post_fraction = cfg.mix_post_fraction;
  spec.tie_embeddings = cfg.tie_embeddings;
  const StudentPrecision precision = cfg.precision;
  spec.dtype = precision == StudentPrecision::kBf16Pure ? at::kBFloat16 : at::kFloat;
  spec.decoder.compute_dtype = precision == StudentPrecision::kBf16Mixed ? at::kBFloat16 : at::ScalarType::Undefined;
  const bool from_teacher = cfg.init == StudentInit::kTeacher;
  if (from_teacher && cfg.tie_embeddings)
    throw InputError("student.tie_embeddings: must be false with student.init = \"teacher\"");
  spec.entry_norm = from_teacher && spec.norm == NormPlacement::kPost;
  spec.freeze_embedding = from_teacher;
  return spec;
}

at::ScalarType StudentSpec::compute() const {
  return decoder.compute_dtype == at::ScalarType::Undefined ? dtype : decoder.compute_dtype;
}

GrowableStudent::GrowableStudent(const StudentSpec& spec, int64_t depth, uint64_t seed,
                                 at::Device device)
    : spec_(spec), seed_(seed) {
  validate_decoder_spec(spec_.decoder, "student");
  if (spec_.vocab_size <= 0) throw InputError("student: vocab_size must be positive");
  if (depth < 1 || depth > spec_.max_depth)
    throw InputError("student: initial depth " + std::to_string(depth) + " outside [1, " +
                     std::to_string(spec_.max_depth) + "]");
  const int64_t h = spec_.decoder.hidden;
  const auto cpu_f32 = at::TensorOptions().dtype(at::kFloat);
  embed_tokens_ = register_module("embed_tokens", Embedding(spec_.vocab_size, h, cpu_f32));
  init_like_hf(*embed_tokens_, generator_for(seed_, kEmbedTag));
  embed_tokens_->to(device, spec_.dtype);
  embed_tokens_->compute_dtype = spec_.decoder.compute_dtype;
  if (spec_.freeze_embedding) embed_tokens_->weight.set_requires_grad(false);
  if (spec_.entry_norm) {
    if (spec_.norm != NormPlacement::kPost)
      throw InputError("student: an entry norm belongs to a post-norm student (pre-norm has its final norm)");
    entry_norm_ = register_module("entry_norm", RMSNorm(h, spec_.decoder.rms_eps, cpu_f32, spec_.decoder.cpu_kernels));
    entry_norm_->to(device, spec_.dtype);
    entry_norm_->compute_dtype = spec_.decoder.compute_dtype;
  }
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < depth; ++i) layers_->push_back(make_block(i));
  if (has_final_norm(spec_.norm)) {
    norm_ = register_module("norm", RMSNorm(h, spec_.decoder.rms_eps, cpu_f32, spec_.decoder.cpu_kernels));
    norm_->to(device, spec_.dtype);
    norm_->compute_dtype = spec_.decoder.compute_dtype;
  }
  if (!spec_.tie_embeddings) {
    lm_head_ = register_module("lm_head", Projection(h, spec_.vocab_size, false, cpu_f32));
    init_like_hf(*lm_head_, generator_for(seed_, kHeadTag));
    lm_head_->to(device, spec_.dtype);
    lm_head_->compute_dtype = spec_.decoder.compute_dtype;
  }
}

int64_t block_of_parameter(const std::string& name) {
  static constexpr std::string_view kPrefix = "layers.";
  if (!name.starts_with(kPrefix)) return -1;
  const size_t dot = name.find('.', kPrefix.size());
  if (dot == std::string::npos || dot == kPrefix.size()) return -1;
  int64_t block = 0;
  for (size_t i = kPrefix.size(); i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    block = block * 10 + (name[i] - '0');
  }
  return block;
}

LayerPlacement GrowableStudent::placement_of(int64_t layer) const {
  return layer_placement(spec_.norm, layer, spec_.max_depth, spec_.mix_post_fraction);
}

DecoderBlock GrowableStudent::make_block(int64_t index) const {
  DecoderBlock block(spec_.decoder, placement_of(index), at::TensorOptions().dtype(at::kFloat));
  init_like_hf(*block, generator_for(seed_, kBlockTag + static_cast<uint64_t>(index)));
  block->to(device(), spec_.dtype);
  return block;
}

DecoderBlock GrowableStudent::block(int64_t i) const {
  if (i < 0 || i >= depth())
    throw std::out_of_range("student block " + std::to_string(i) + " of " + std::to_string(depth()));
  return DecoderBlock(layers_->ptr<DecoderBlockImpl>(static_cast<size_t>(i)));
}

void GrowableStudent::grow_to(int64_t new_depth, GrowInit init, int64_t block_layers) {
  if (new_depth < depth() || new_depth > spec_.max_depth)
    throw InputError("student: cannot grow from depth " + std::to_string(depth()) + " to " +
                     std::to_string(new_depth) + " (max depth " + std::to_string(spec_.max_depth) + ")");
  if (init == GrowInit::kTeacher)
    throw std::logic_error("GrowableStudent::grow_to: \"teacher\" growth reads the teacher (grow_student, "
                           "curriculum/growth_operator.h)");
  const int64_t old_depth = depth();
  if (init == GrowInit::kStack && (block_layers < 1 || old_depth % block_layers != 0 || block_layers > old_depth))
    throw InputError("curriculum.grow_init = \"stack\": the student's depth " + std::to_string(old_depth) +
                     " is not a whole number of blocks of " + std::to_string(block_layers) + " layers");
  for (int64_t i = old_depth; i < new_depth; ++i) {
    DecoderBlock b = make_block(i);
    at::NoGradGuard no_grad;
    if (init == GrowInit::kStack) {
      // G_stack: the last block again, layer by layer in order.
      const int64_t source = old_depth - block_layers + (i - old_depth) % block_layers;
      const auto src = block(source)->named_parameters();
      for (auto& item : b->named_parameters()) item.value().copy_(src[item.key()]);
    } else if (init == GrowInit::kIdentity) {
      b->self_attn->o_proj->weight.zero_();
      if (b->self_attn->o_proj->bias.defined()) b->self_attn->o_proj->bias.zero_();
      b->mlp->down_proj->weight.zero_();
    }
    layers_->push_back(b);
  }
}

void GrowableStudent::freeze_prefix(int64_t n_blocks, bool freeze_ends) {
  if (n_blocks < 0 || n_blocks > depth())
    throw std::out_of_range("freeze_prefix(" + std::to_string(n_blocks) + ") with depth " +
                            std::to_string(depth()));
  unfreeze_all();
  if (freeze_ends) {
    for (auto& p : embed_tokens_->parameters()) p.set_requires_grad(false);
    if (entry_norm_) for (auto& p : entry_norm_->parameters()) p.set_requires_grad(false);
    if (norm_) for (auto& p : norm_->parameters()) p.set_requires_grad(false);
    if (lm_head_) for (auto& p : lm_head_->parameters()) p.set_requires_grad(false);
  }
  for (int64_t i = 0; i < n_blocks; ++i)
    for (auto& p : block(i)->parameters()) p.set_requires_grad(false);
}

void GrowableStudent::unfreeze_all() {
  for (auto& p : parameters()) p.set_requires_grad(true);
  if (spec_.freeze_embedding) embed_tokens_->weight.set_requires_grad(false);
}

std::string GrowableStudent::boundary_norm_name() const {
  if (norm_) return "norm.weight";
  if (entry_norm_) return "entry_norm.weight";
  return "";
}

uint64_t GrowableStudent::parameter_checksum() const {
  uint64_t h = 0xcbf29ce484222325ULL;
  auto feed = [&h](const void* data, size_t n) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t word;
      std::memcpy(&word, bytes + i, 8);
      h = (h ^ word) * 0x100000001b3ULL;
    }
    for (; i < n; ++i) h = (h ^ bytes[i]) * 0x100000001b3ULL;
  };
  for (const auto& item : named_parameters(/*recurse=*/true)) {
    const at::Tensor cpu = item.value().detach().to(at::kCPU).contiguous();
    feed(item.key().data(), item.key().size());
    const int64_t dtype = static_cast<int64_t>(cpu.scalar_type());
    feed(&dtype, sizeof dtype);
    for (int64_t s : cpu.sizes()) feed(&s, sizeof s);
    feed(cpu.data_ptr(), cpu.nbytes());
  }
  return h;
}

std::vector<std::pair<std::string, at::Tensor>> GrowableStudent::named_trainable_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : named_parameters(/*recurse=*/true))
    if (item.value().requires_grad()) out.emplace_back(item.key(), item.value());
  return out;
}

at::Device GrowableStudent::device() const { return embed_tokens_->weight.device(); }

Rotary GrowableStudent::rotary(int64_t seq_len) const {
  return make_rotary(seq_len, spec_.decoder.head_dim, spec_.decoder.rope_theta, spec_.compute(), device());
}

at::Tensor GrowableStudent::embed(const at::Tensor& ids) {
  const at::Tensor x = embed_tokens_(ids.to(device()));
  return entry_norm_ ? entry_norm_(x) : x;
}

at::Tensor GrowableStudent::apply_block(int64_t i, const at::Tensor& x) { return run_block(i, x, rotary(x.size(1))); }

at::Tensor GrowableStudent::run_block(int64_t i, const at::Tensor& x, const Rotary& rope) {
  if (gate_) gate_->gather(i);
  at::Tensor y = block(i)->forward(x, rope);
  if (gate_ && !at::GradMode::is_enabled()) gate_->release(i);
  return y;
}

at::Tensor GrowableStudent::head_input(const at::Tensor& last_block_output) {
  return norm_ ? norm_(last_block_output) : last_block_output;
}

at::Tensor GrowableStudent::forward_hidden(const at::Tensor& ids) {
  at::Tensor x = embed(ids);  // through the entry norm, if any
  const Rotary rope = rotary(ids.size(1));
  for (int64_t i = 0; i < depth(); ++i) {
    auto run = [b = block(i), rope, gate = gate_, i](const at::Tensor& in) mutable {
      if (gate) gate->gather(i);
      return b->forward(in, rope);
    };
    std::function<void()> done;
    if (gate_) done = [gate = gate_, i] { gate->release(i); };
    if (spec_.decoder.recompute == Recompute::kLayer) {
      x = recomputed(run, x, done);
    } else {
      x = run(x);
      if (done && !at::GradMode::is_enabled()) done();
    }
  }
  return head_input(x);
}

at::Tensor GrowableStudent::head_parameter() const { return lm_head_ ? lm_head_->weight : embed_tokens_->weight; }

at::Tensor GrowableStudent::head_weight() const { return in_compute_dtype(head_parameter(), spec_.decoder.compute_dtype); }

at::Tensor GrowableStudent::forward(const at::Tensor& ids) {
  return at::linear(forward_hidden(ids), head_weight());
}

std::vector<at::Tensor> GrowableStudent::residual_stream(const at::Tensor& ids) {
  std::vector<at::Tensor> out;
  out.reserve(static_cast<size_t>(depth()) + 1);
  out.push_back(embed(ids));
  const Rotary rope = rotary(ids.size(1));
  for (int64_t i = 0; i < depth(); ++i) out.push_back(run_block(i, out.back(), rope));
  return out;
}

}  // namespace deepen
