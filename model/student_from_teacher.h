// The paper's student init: embedding, LM head and boundary norm copied from a Hugging Face teacher.
#pragma once

#include <string>

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

}  // namespace deepen
