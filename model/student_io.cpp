// Student files (safetensors + spec metadata) and Hugging Face export.
#include "model/student_io.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "config/text_file.h"
#include "model/hf_names.h"
#include "model/safetensors.h"
#include "model/tensor_bridge.h"
#include "model/torch_dtype.h"

namespace deepen {
namespace {

constexpr const char* kFormat = "deepen-student-v1";

std::string hf_name(const std::string& name) {
  return name.rfind("lm_head.", 0) == 0 ? name : "model." + name;
}

nlohmann::json spec_json(const GrowableStudent& s) {
  const StudentSpec& spec = s.spec();
  return {{"hidden", spec.decoder.hidden},
          {"heads", spec.decoder.heads},
          {"kv_heads", spec.decoder.kv_heads},
          {"head_dim", spec.decoder.head_dim},
          {"intermediate", spec.decoder.intermediate},
          {"rope_theta", spec.decoder.rope_theta},
          {"rms_eps", spec.decoder.rms_eps},
          {"attention_bias", spec.decoder.attention_bias},
          {"vocab_size", spec.vocab_size},
          {"max_depth", spec.max_depth},
          {"norm", option_name(spec.norm)},
          {"tie_embeddings", spec.tie_embeddings},
          {"entry_norm", spec.entry_norm},
          {"freeze_embedding", spec.freeze_embedding},
          {"dtype", float_dtype_name(float_dtype_of(spec.dtype))},
          {"compute_dtype", float_dtype_name(float_dtype_of(spec.compute()))},
          {"depth", s.depth()},
          {"seed", s.seed()}};
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> hf_named_tensors(const GrowableStudent& student) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : student.named_parameters(/*recurse=*/true))
    out.emplace_back(hf_name(item.key()), item.value());
  return out;
}

Qwen3Config hf_config_of(const GrowableStudent& student) {
  const StudentSpec& spec = student.spec();
  Qwen3Config c;
  c.vocab_size = spec.vocab_size;
  c.hidden_size = spec.decoder.hidden;
  c.intermediate_size = spec.decoder.intermediate;
  c.num_hidden_layers = student.depth();
  c.num_attention_heads = spec.decoder.heads;
  c.num_key_value_heads = spec.decoder.kv_heads;
  c.head_dim = spec.decoder.head_dim;
  c.rope_theta = spec.decoder.rope_theta;
  c.rms_norm_eps = spec.decoder.rms_eps;
  c.tie_word_embeddings = spec.tie_embeddings;
  c.attention_bias = spec.decoder.attention_bias;
  c.torch_dtype = spec.dtype == at::kBFloat16 ? "bfloat16" : "float32";
  return c;
}

void save_student(const GrowableStudent& student, const std::string& path) {
  write_tensors(path, hf_named_tensors(student),
                {{"format", kFormat}, {"student", spec_json(student).dump()}});
}

std::shared_ptr<GrowableStudent> load_student(const std::string& path, at::Device device, CpuKernels kernels,
                                              Recompute recompute) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  const auto& meta = file.metadata();
  auto format = meta.find("format");
  auto student_meta = meta.find("student");
  if (format == meta.end() || format->second != kFormat || student_meta == meta.end())
    throw InputError(path + ": not a deepen student file (metadata format != \"" + kFormat + "\")");
  StudentSpec spec;
  int64_t depth = 0;
  uint64_t seed = 0;
  try {
    const nlohmann::json j = nlohmann::json::parse(student_meta->second);
    spec.decoder.hidden = j.at("hidden");
    spec.decoder.heads = j.at("heads");
    spec.decoder.kv_heads = j.at("kv_heads");
    spec.decoder.head_dim = j.at("head_dim");
    spec.decoder.intermediate = j.at("intermediate");
    spec.decoder.rope_theta = j.at("rope_theta");
    spec.decoder.rms_eps = j.at("rms_eps");
    spec.decoder.attention_bias = j.at("attention_bias");
    spec.vocab_size = j.at("vocab_size");
    spec.max_depth = j.at("max_depth");
    spec.norm = parse_option<NormPlacement>(j.at("norm").get<std::string>(), path + ": metadata student.norm");
    spec.tie_embeddings = j.at("tie_embeddings");
    // Files written before the paper's student existed have neither key: both were false.
    spec.entry_norm = j.value("entry_norm", false);
    spec.freeze_embedding = j.value("freeze_embedding", false);
    spec.dtype = to_scalar_type(parse_float_dtype(j.at("dtype").get<std::string>(), path + ": metadata student.dtype"));
    // bf16-mixed students store fp32 masters and compute in bf16; files without the key computed
    // in their parameters' dtype.
    const at::ScalarType compute = to_scalar_type(parse_float_dtype(
        j.value("compute_dtype", float_dtype_name(float_dtype_of(spec.dtype))), path + ": metadata student.compute_dtype"));
    spec.decoder.compute_dtype = compute == spec.dtype ? at::ScalarType::Undefined : compute;
    depth = j.at("depth");
    seed = j.at("seed");
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": metadata \"student\": " + e.what());
  }
  spec.decoder.cpu_kernels = kernels;
  spec.decoder.recompute = recompute;
  auto student = std::make_shared<GrowableStudent>(spec, depth, seed, device);
  std::set<std::string> expected;
  at::NoGradGuard no_grad;
  for (auto& [name, param] : hf_named_tensors(*student)) {
    expected.insert(name);
    const TensorInfo* info = file.find(name);
    if (info == nullptr) throw InputError(path + ": tensor " + name + ": missing");
    const std::vector<int64_t> want(param.sizes().begin(), param.sizes().end());
    if (info->shape != want)
      throw InputError(path + ": tensor " + name + ": shape " + shape_string(info->shape) +
                       ", the student's metadata says " + shape_string(want));
    if (!is_floating(info->dtype))
      throw InputError(path + ": tensor " + name + ": dtype " + dtype_name(info->dtype) +
                       ", expected a floating dtype");
    param.copy_(file_tensor(file, *info));
  }
  for (const TensorInfo& info : file.tensors())
    if (!expected.count(info.name))
      throw InputError(path + ": tensor " + info.name + ": not part of a depth-" +
                       std::to_string(depth) + " student");
  return student;
}

void export_student_hf(const GrowableStudent& student, const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path final_dir(dir);
  const fs::path tmp = final_dir.string() + ".tmp";
  const fs::path old = final_dir.string() + ".old";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  nlohmann::json config = nlohmann::json::parse(qwen3_config_json(hf_config_of(student)));
  config["deepen_norm"] = option_name(student.spec().norm);
  config["deepen_max_depth"] = student.spec().max_depth;
  config["deepen_seed"] = student.seed();
  if (student.spec().entry_norm) config["deepen_entry_norm"] = true;
  if (student.spec().norm == NormPlacement::kPost)
    config["deepen_note"] = std::string(
        "post-norm student (h = norm(x + attn(x)); y = norm(h + mlp(h)); no final norm") +
        (student.spec().entry_norm ? "; model.entry_norm.weight normalizes the embedding output" : "") +
        "): transformers' Qwen3 implementation cannot run it; deepen forward --model reads it";
  // Checked at close: a full disk or quota on NFS or Lustre shows only when the data leaves the cache.
  write_file_text((tmp / "config.json").string(), config.dump(2) + "\n", "the export's config");
  write_tensors((tmp / "model.safetensors").string(), hf_named_tensors(student),
                {{"format", "pt"}});
  fs::remove_all(old);
  if (fs::exists(final_dir)) fs::rename(final_dir, old);
  fs::rename(tmp, final_dir);
  fs::remove_all(old);
}

std::shared_ptr<GrowableStudent> load_student_hf(const std::string& dir, at::ScalarType dtype,
                                                 at::Device device) {
  const std::string config_path = dir + "/config.json";
  const Qwen3Config config = read_qwen3_config(config_path);
  nlohmann::json extra;
  {
    std::ifstream in(config_path);
    std::stringstream text;
    text << in.rdbuf();
    extra = nlohmann::json::parse(text.str());  // read_qwen3_config has validated it already
  }
  StudentSpec spec;
  spec.decoder = decoder_spec_from(config);
  spec.vocab_size = config.vocab_size;
  spec.tie_embeddings = config.tie_word_embeddings;
  spec.dtype = dtype;
  spec.norm = parse_option<NormPlacement>(extra.value("deepen_norm", std::string("pre")), config_path + ": deepen_norm");
  spec.entry_norm = extra.value("deepen_entry_norm", false);
  spec.max_depth = extra.value("deepen_max_depth", config.num_hidden_layers);
  if (spec.max_depth < config.num_hidden_layers)
    throw InputError(config_path + ": deepen_max_depth " + std::to_string(spec.max_depth) +
                     " < num_hidden_layers " + std::to_string(config.num_hidden_layers));
  const uint64_t seed = extra.value("deepen_seed", uint64_t{0});
  auto student = std::make_shared<GrowableStudent>(spec, config.num_hidden_layers, seed, device);

  std::vector<ExpectedTensor> expected;
  expected.push_back(expected_embedding(config));
  if (spec.entry_norm) {
    ExpectedTensor entry = expected_final_norm(config);
    entry.name = "model.entry_norm.weight";
    entry.part = "entry_norm.weight";
    expected.push_back(entry);
  }
  for (int i = 0; i < static_cast<int>(config.num_hidden_layers); ++i)
    for (ExpectedTensor& e : expected_layer_tensors(config, i)) expected.push_back(std::move(e));
  if (spec.norm == NormPlacement::kPre) expected.push_back(expected_final_norm(config));
  if (auto head = expected_head(config)) expected.push_back(*head);
  auto params = student->named_parameters(/*recurse=*/true);
  if (params.size() != expected.size())
    throw std::logic_error("load_student_hf: student has " + std::to_string(params.size()) +
                           " parameters, the HF table lists " + std::to_string(expected.size()));
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir);
  at::NoGradGuard no_grad;
  for (const ExpectedTensor& e : expected) {
    const std::string local = e.name.rfind("model.", 0) == 0 ? e.name.substr(6) : e.name;
    at::Tensor* p = params.find(local);
    if (p == nullptr) throw std::logic_error("load_student_hf: no student parameter " + local);
    check_expected_tensor(ckpt, e);
    p->copy_(checkpoint_tensor(ckpt, e.name));
  }
  return student;
}

}  // namespace deepen
