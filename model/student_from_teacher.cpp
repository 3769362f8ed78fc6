// Student init from a teacher: the two ends (embedding + head) and the boundary norm are copied.
#include "model/student_from_teacher.h"

#include <ATen/ATen.h>

#include "config/input_error.h"
#include "model/hf_config.h"
#include "model/hf_names.h"
#include "model/safetensors.h"
#include "model/tensor_bridge.h"

namespace deepen {

void copy_teacher_ends(GrowableStudent& student, const std::string& teacher_dir) {
  const std::string config_path = teacher_dir + "/config.json";
  const Qwen3Config tc = read_qwen3_config(config_path);
  const StudentSpec& spec = student.spec();
  const std::string why = " (student.init = \"teacher\" copies the [vocab, hidden] embedding and head)";
  if (tc.hidden_size != spec.decoder.hidden)
    throw InputError("student.hidden = " + std::to_string(spec.decoder.hidden) +
                     " cannot take the teacher's embedding: " + config_path + " has hidden_size = " +
                     std::to_string(tc.hidden_size) + why);
  if (tc.vocab_size != spec.vocab_size)
    throw InputError("student vocabulary = " + std::to_string(spec.vocab_size) + " rows, but " + config_path +
                     " has vocab_size = " + std::to_string(tc.vocab_size) + why);
  if (spec.tie_embeddings)
    throw InputError("student.tie_embeddings: must be false with student.init = \"teacher\" (the embedding is "
                     "frozen, the head trains)");
  const std::string boundary = student.boundary_norm_name();
  if (boundary.empty())
    throw InputError("student.init = \"teacher\": a post-norm student needs its entry norm to take the "
                     "teacher's final norm");

  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(teacher_dir);
  const ExpectedTensor embedding = expected_embedding(tc);
  // A tied teacher's head is its embedding matrix.
  const ExpectedTensor head = expected_head(tc).value_or(embedding);
  const ExpectedTensor final_norm = expected_final_norm(tc);
  auto params = student.named_parameters(/*recurse=*/true);
  at::NoGradGuard no_grad;
  for (const auto& [from, to] : {std::pair{embedding, std::string("embed_tokens.weight")},
                                 std::pair{head, std::string("lm_head.weight")},
                                 std::pair{final_norm, boundary}}) {
    check_expected_tensor(ckpt, from);
    at::Tensor* p = params.find(to);
    if (p == nullptr) throw std::logic_error("copy_teacher_ends: the student has no parameter " + to);
    p->copy_(checkpoint_tensor(ckpt, from.name));
  }
}

void check_teacher_layer_shapes(const StudentSpec& spec, const std::string& teacher_dir) {
  const std::string config_path = teacher_dir + "/config.json";
  const DecoderSpec& d = spec.decoder;
  check_same_layer_shapes({d.hidden, d.heads, d.kv_heads, d.head_dim, d.intermediate, d.attention_bias, d.rope_theta},
                          layer_shapes_of(read_qwen3_config(config_path)), config_path);
}

void copy_teacher_layers(GrowableStudent& student, const std::vector<TeacherLayerCopy>& copies,
                         const std::string& teacher_dir) {
  check_teacher_layer_shapes(student.spec(), teacher_dir);
  const Qwen3Config tc = read_qwen3_config(teacher_dir + "/config.json");
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(teacher_dir);
  at::NoGradGuard no_grad;
  for (const TeacherLayerCopy& c : copies) {
    if (c.from < 0 || c.from >= tc.num_hidden_layers)
      throw std::out_of_range("copy_teacher_layers: teacher layer " + std::to_string(c.from) + " of " +
                              std::to_string(tc.num_hidden_layers));
    const DecoderBlock block = student.block(c.to);
    // Qwen3's two norms sit on the sub-layers' inputs; a post-norm layer's two sit after the adds.
    const bool input_norms = block->placement.norms != LayerNorms::kPost;
    auto params = block->named_parameters();
    for (const ExpectedTensor& e : expected_layer_tensors(tc, static_cast<int>(c.from))) {
      const bool layer_norm = e.part == "input_layernorm.weight" || e.part == "post_attention_layernorm.weight";
      if (layer_norm && !input_norms) continue;  // an output norm: it keeps its init, 1
      at::Tensor* p = params.find(e.part);
      if (p == nullptr) throw std::logic_error("copy_teacher_layers: the student's layer has no " + e.part);
      check_expected_tensor(ckpt, e);
      p->copy_(checkpoint_tensor(ckpt, e.name));
    }
  }
}

}  // namespace deepen
