// TeacherStage: a contiguous range of a Hugging Face Qwen3 checkpoint's decoder layers, loaded
// alone (only its tensors are read), run forward-only in fp32 or bf16.
#pragma once

#include <memory>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include "model/hf_config.h"
#include "model/layer_split.h"
#include "model/qwen3.h"

namespace deepen {

// Stage of a pipeline over layers [first, last):
//   is_first: owns model.embed_tokens; forward takes ids [B, T] int64.
//   otherwise forward takes the previous stage's hidden [B, T, hidden] (cast to the stage dtype).
//   is_last:  owns model.norm and the head (lm_head, or the embedding when tie_word_embeddings);
//             forward returns logits [B, T, vocab] in the stage dtype. With with_head = false
//             (distill.logits = "hidden": the students hold the head) it neither reads nor runs
//             the head and returns the final normalised hidden states [B, T, hidden].
//   otherwise forward returns hidden [B, T, hidden] in the stage dtype.
// A whole teacher is TeacherStage(dir, 0, num_hidden_layers, true, true, ...). Stages are frozen:
// parameters have requires_grad = false and forward runs under NoGradGuard (not InferenceMode:
// its outputs feed the student's loss, which autograd must be able to save).
class TeacherStage : public torch::nn::Module {
 public:
  // Reads dir/config.json and, through SafetensorsCheckpoint (lazy shards), only this stage's
  // tensors, each checked against the config (modelio's hf_names table). Throws InputError naming
  // the file and tensor (missing tensor, shape or dtype mismatch, bad config), or the range
  // (need 0 <= first < last <= num_hidden_layers, is_first == (first == 0),
  // is_last == (last == num_hidden_layers)). dtype: at::kFloat or at::kBFloat16. kernels: the fp32
  // CPU path (teacher.cpu_kernels, model/cpu_kernel_choice.h).
  TeacherStage(const std::string& dir, int first, int last, bool is_first, bool is_last,
               at::ScalarType dtype, at::Device device = at::kCPU, CpuKernels kernels = CpuKernels::kAuto,
               bool with_head = true);
  static std::shared_ptr<TeacherStage> load(const std::string& dir, int first, int last,
                                            bool is_first, bool is_last, at::ScalarType dtype,
                                            at::Device device = at::kCPU, CpuKernels kernels = CpuKernels::kAuto,
                                            bool with_head = true) {
    return std::make_shared<TeacherStage>(dir, first, last, is_first, is_last, dtype, device, kernels, with_head);
  }

  at::Tensor forward(const at::Tensor& input);

  // The last stage's forward split at the head, so the logits can be written where they are
  // needed (the logit channel's send buffer, in the wire's dtype) instead of into a tensor of
  // their own first: forward() of a last stage with the head is
  //   head_into(final_hidden(input), at::empty({B, T, vocab}, stage dtype and device)).
  // final_hidden: the final normalised hidden states [B, T, hidden] (last stage only).
  at::Tensor final_hidden(const at::Tensor& input);
  // Writes the logits of `hidden`'s rows [..., hidden] into `out` [rows, vocab] (any floating
  // dtype, any device, contiguous), head_rows() rows at a time: each chunk is computed in the
  // stage's dtype on its device, then cast and copied into its rows of `out`, so nothing of the
  // whole [rows, vocab] exists besides `out` (at the paper's micro-batch, 16,384 x 151,936 logits:
  // 4.98 GB in bf16, 9.96 GB in fp32). An `out` in the stage's dtype and device needs no chunk
  // buffer: it is written by one GEMM. forward() goes through the same call, so a teacher in the
  // student's process and one behind a logit channel of the stage's dtype compute the same logits
  // bit for bit. Needs a stage with the head (is_last, with_head).
  void head_into(const at::Tensor& hidden, const at::Tensor& out) const;
  // Rows per head_into chunk: about 64 MiB of fp32 logits (110 rows at vocab 151,936), at least 1.
  int64_t head_rows() const;

  const Qwen3Config& config() const { return config_; }
  int first_layer() const { return first_; }
  int last_layer() const { return last_; }
  bool is_first() const { return is_first_; }
  bool is_last() const { return is_last_; }
  bool with_head() const { return with_head_; }
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }
  // HF names of the tensors this stage read, in load order (tests: "reads only its tensors").
  const std::vector<std::string>& loaded_tensor_names() const { return loaded_; }
  // Safetensors files the load opened (a sharded checkpoint: only the shards holding its tensors).
  const std::vector<std::string>& opened_files() const { return opened_files_; }

 private:
  at::Tensor body(const at::Tensor& input);  // embedding or cast, the layers, and the final norm if last
  Qwen3Config config_;
  DecoderSpec spec_;
  int first_, last_;
  bool is_first_, is_last_;
  bool with_head_ = true;
  at::ScalarType dtype_;
  at::Device device_;
  std::vector<std::string> loaded_;
  std::vector<std::string> opened_files_;
  Embedding embed_tokens_{nullptr};
  torch::nn::ModuleList layers_{nullptr};  // local index j = layer first + j
  RMSNorm norm_{nullptr};
  Projection lm_head_{nullptr};  // lm_head.weight; or, tied, the embedding when stage 0 lacks it
  at::Tensor head_weight_;       // what the head multiplies by: lm_head_ or the tied embedding
};

// The teacher's LM head [vocab, hidden] alone, as the student of a hidden-state channel needs it:
// lm_head.weight, or model.embed_tokens.weight when the checkpoint ties them (small Qwen3 models),
// checked against dir/config.json like every stage tensor, frozen, in `dtype` on `device`. Throws
// InputError naming the file and tensor when the checkpoint lacks it.
at::Tensor load_teacher_head(const std::string& dir, at::ScalarType dtype, at::Device device = at::kCPU);

}  // namespace deepen
