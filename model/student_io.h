// Saving, loading and Hugging Face export of a GrowableStudent.
#pragma once

#include <memory>
#include <string>

#include "model/hf_config.h"
#include "model/student.h"

namespace deepen {

// The student's tensors under their Hugging Face names ("model." + name, and lm_head.weight), in
// named_parameters() order, with the stored dtype.
std::vector<std::pair<std::string, at::Tensor>> hf_named_tensors(const GrowableStudent& student);

// transformers' Qwen3Config for the active model (num_hidden_layers = depth()).
Qwen3Config hf_config_of(const GrowableStudent& student);

// One safetensors file: the tensors above plus "__metadata__" {"format": "deepen-student-v1",
// "student": JSON of the spec, depth and seed}. Atomic (write_safetensors writes a temp and renames).
// A trainer checkpoint can hold this file as is.
void save_student(const GrowableStudent& student, const std::string& path);

// Rebuilds the student a file holds (spec, depth and seed from its metadata, weights from its
// tensors). Throws InputError naming the file and tensor: not a deepen student file, missing or
// extra tensor, shape or dtype mismatch. kernels (student.cpu_kernels) and recompute
// (student.recompute) are properties of the run, not of the file: a resumed trainer passes its
// config's, so it rounds (and saves memory) as the run it continues did. compute_override (not
// Undefined): compute in that dtype instead of the file's (deepen forward --dtype bf16 on fp32
// weights computes as a bf16-mixed run does).
std::shared_ptr<GrowableStudent> load_student(const std::string& path, at::Device device = at::kCPU,
                                              CpuKernels kernels = CpuKernels::kAuto,
                                              Recompute recompute = Recompute::kNone,
                                              at::ScalarType compute_override = at::ScalarType::Undefined);

// A Hugging Face folder: config.json (write_qwen3_config's, plus "deepen_norm" and, for post-norm,
// "deepen_note") and model.safetensors. Written to <dir>.tmp, then renamed over <dir> (an existing
// <dir> is replaced). Pre-norm students load in transformers as Qwen3ForCausalLM with the same
// logits; so do pre_scaled ones, written as pre-norm with each layer's 1/sqrt(l) multiplied into its
// two norm gains (hf_export_tensors). Post-norm students are written in the same layout without
// model.norm.weight (they have no final norm; with an entry norm, model.entry_norm.weight and
// "deepen_entry_norm": true); transformers' Qwen3 would run them as pre-norm, i.e. wrongly.
// Peri and mix students have no such layout: InputError naming the placement
// (hf_export_refusal, model/norm_placement.h), nothing written.
void export_student_hf(const GrowableStudent& student, const std::string& dir);

// The tensors export_student_hf writes: hf_named_tensors, with pre_scaled's scales folded in.
std::vector<std::pair<std::string, at::Tensor>> hf_export_tensors(const GrowableStudent& student);

// A student from a Hugging Face Qwen3 folder (one that export_student_hf wrote, or any Qwen3
// checkpoint: then pre-norm, max_depth = num_hidden_layers, seed 0). Reads "deepen_norm",
// "deepen_max_depth", "deepen_entry_norm" and "deepen_seed" from config.json when present. dtype: the student's
// compute dtype (kFloat or kBFloat16). Throws InputError naming the file and tensor.
std::shared_ptr<GrowableStudent> load_student_hf(const std::string& dir, at::ScalarType dtype = at::kFloat,
                                                 at::Device device = at::kCPU);

}  // namespace deepen
