// The whole-model tasks behind `deepen forward` and `deepen export`, with std-only signatures so
// the command files stay free of torch headers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/float_dtype.h"

namespace deepen {

// Token ids from text: one sequence per non-blank line, ids separated by whitespace. Throws
// InputError "<origin>:<line>: <reason>" for a non-integer token, an id < 0 or >= vocab_size, or
// no sequence at all. Lines may differ in length.
std::vector<std::vector<int64_t>> parse_id_lines(const std::string& text, const std::string& origin,
                                                 int64_t vocab_size);

struct ForwardRequest {
  // A Hugging Face Qwen3 folder, a deepen export of any placement (config.json has deepen_norm), or
  // a student's own file: a .safetensors file or a folder holding student.safetensors (a run's
  // final/, a checkpoint folder).
  std::string model_dir;
  std::string ids_path;       // text file for parse_id_lines
  std::string out_path;       // .safetensors to write
  FloatDtype dtype = FloatDtype::kFp32;  // compute dtype
  std::string device = "auto";  // "auto" (CUDA if present) | "cpu" | "cuda"
};

struct ForwardSummary {
  int64_t sequences = 0;
  int64_t tokens = 0;
  int64_t vocab_size = 0;
  std::string device;
};

// Loads the model (a student as the trainer builds it, whatever its placement; a plain Qwen3
// checkpoint as one teacher stage) and runs each line as its own batch-1 sequence (no padding, so
// lines of any length give exactly what the model computes for them alone). Writes F32 tensors
// "logits.<i>" [T_i, vocab], i = 0-based sequence index, to out_path (atomic).
ForwardSummary run_forward(const ForwardRequest& request);

struct ExportSummary {
  std::string dir;
  std::string norm;            // student.norm: "pre" | "post" | "pre_scaled" (peri and mix are refused)
  int64_t depth = 0;
  bool transformers_compatible = false;  // pre and pre_scaled
  bool scale_folded = false;             // pre_scaled: 1/sqrt(l) written into the norm gains
};

// Reads a student saved by save_student (a file, or a folder holding student.safetensors) and
// writes it with export_student_hf.
ExportSummary export_student_file(const std::string& student_path, const std::string& out_dir);

}  // namespace deepen
