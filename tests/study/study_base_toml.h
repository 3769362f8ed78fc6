// The small base config the study tests expand (a 3-layer grow curriculum on the e2e fixtures' data
// and teacher); each test adds the sections its case needs.
#pragma once

namespace deepen::test {

inline constexpr const char* kStudyBaseToml = R"(
[data]
train = "data/train"
valid = "data/valid"
seq_len = 32
[teacher]
checkpoint = "teacher/final/hf"
[student]
layers = 3
hidden = 32
heads = 2
kv_heads = 1
head_dim = 16
intermediate = 64
[curriculum]
mode = "grow"
stages = [1, 2, 3]
stage_steps = [4, 4, 4]
[parallel]
teacher_pipelines = 1
teacher_stages = 2
students = 2
micro_batch = 2
)";

}  // namespace deepen::test
