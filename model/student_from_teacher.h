// The paper's student init: embedding, LM head and boundary norm copied from a Hugging Face teacher.
#pragma once

#include <string>
#include <vector>

#include "model/student.h"

namespace deepen {

// Copies, from the Qwen3 folder `teacher_dir` (config.json + safetensors), into `student`:
//   model.embed_tokens.weight -> embed_tokens.weight  (frozen when spec().freeze_embedding)
//   lm_head.weight            -> lm_head.weight       (a tied teacher's head is its embedding)
//   model.norm.weight         -> the boundary norm: norm.weight (pre) or entry_norm.weight (post)
// Decoder blocks keep their own (random) init: the paper copies only the two ends.
// The student must be untied (its head trains while the embedding is frozen) and as wide as the
// teacher with the same vocabulary. Throws InputError naming both sides, e.g.
//   "student.hidden = 1024 cannot take the teacher's embedding: <dir>/config.json has
//    hidden_size = 4096 (student.init = "teacher" copies the [vocab, hidden] embedding and head)"
// and the file and tensor for a missing or mis-shaped teacher tensor.
void copy_teacher_ends(GrowableStudent& student, const std::string& teacher_dir);

// Throws InputError unless the student's layers have the teacher's layer shapes (hidden, heads,
// kv_heads, head_dim, intermediate, attention biases) and RoPE theta, naming the first that differs
// (check_same_layer_shapes, model/hf_config.h).
void check_teacher_layer_shapes(const StudentSpec& spec, const std::string& teacher_dir);

// The growth operator "teacher" (curriculum/growth_operator.h decides which teacher layer each student
// layer takes): student layer `to` gets teacher layer `from`, tensor by tensor:
//   q/k/v/o_proj (and biases), q_norm, k_norm, gate/up/down_proj      copied
//   input_layernorm, post_attention_layernorm                          copied where the layer's
//       placement uses them on sub-layer inputs as Qwen3 does (pre, pre_scaled, peri, mix's pre-norm
//       layers); 1 where they are output norms (post, mix's post-norm layers): the teacher has none
//   attn_output_layernorm, mlp_output_layernorm (peri)                 1 (new output norms)
// RoPE has no parameters (the theta is checked equal). Checks shapes first (check_teacher_layer_shapes).
struct TeacherLayerCopy {
  int64_t to = 0;    // student layer (< student.depth())
  int64_t from = 0;  // teacher layer
};
void copy_teacher_layers(GrowableStudent& student, const std::vector<TeacherLayerCopy>& copies,
                         const std::string& teacher_dir);

}  // namespace deepen
