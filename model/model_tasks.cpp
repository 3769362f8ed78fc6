// `deepen forward` and `deepen export` as library functions.
#include "model/model_tasks.h"

#include <charconv>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "config/text_file.h"
#include "model/hf_config.h"
#include "model/student_io.h"
#include "model/teacher_stage.h"
#include "model/tensor_bridge.h"
#include "model/torch_dtype.h"

namespace deepen {

std::vector<std::vector<int64_t>> parse_id_lines(const std::string& text, const std::string& origin,
                                                 int64_t vocab_size) {
  std::vector<std::vector<int64_t>> sequences;
  std::istringstream lines(text);
  std::string line;
  for (int line_no = 1; std::getline(lines, line); ++line_no) {
    std::istringstream words(line);
    std::string word;
    std::vector<int64_t> ids;
    while (words >> word) {
      int64_t id = 0;
      const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
      const std::string where = origin + ":" + std::to_string(line_no) + ": ";
      if (ec != std::errc() || end != word.data() + word.size())
        throw InputError(where + "\"" + word + "\" is not an integer token id");
      if (id < 0 || id >= vocab_size)
        throw InputError(where + "token id " + word + " outside the vocabulary [0, " +
                         std::to_string(vocab_size) + ")");
      ids.push_back(id);
    }
    if (!ids.empty()) sequences.push_back(std::move(ids));
  }
  if (sequences.empty()) throw InputError(origin + ": no token ids (one sequence per line)");
  return sequences;
}

namespace {

at::Device pick_device(const std::string& name) {
  switch (parse_option<RunDevice>(name, "--device")) {
    case RunDevice::kCpu: return at::kCPU;
    case RunDevice::kCuda:
      if (!at::hasCUDA()) throw InputError("--device cuda: no CUDA device available");
      return at::Device(at::kCUDA, 0);
    case RunDevice::kAuto: break;
  }
  return at::hasCUDA() ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
}

}  // namespace

namespace {

// The student file a path names, if it names one: a .safetensors file, or a folder holding
// student.safetensors (a run's final/ or a checkpoint folder).
std::optional<std::string> student_file_at(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(path) && fs::path(path).extension() == ".safetensors") return path;
  const fs::path inside = fs::path(path) / "student.safetensors";
  if (fs::is_regular_file(inside)) return inside.string();
  return std::nullopt;
}

// Whether a Hugging Face folder is a deepen export (config.json says which placement it holds).
bool is_deepen_export(const std::string& config_path) {
  const nlohmann::json j = nlohmann::json::parse(read_file_text(config_path), nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("deepen_norm");
}

}  // namespace

ForwardSummary run_forward(const ForwardRequest& request) {
  const at::ScalarType dtype = to_scalar_type(request.dtype);
  const at::Device device = pick_device(request.device);
  // One function from ids to logits, whichever model the path holds: a student (its own file, or
  // its export: every placement, read as the trainer built it) or a plain Qwen3 checkpoint (one
  // teacher stage over all its layers).
  std::function<at::Tensor(const at::Tensor&)> logits_of;
  int64_t vocab = 0;
  std::shared_ptr<GrowableStudent> student;
  std::unique_ptr<TeacherStage> qwen3;
  if (const auto file = student_file_at(request.model_dir)) {
    student = load_student(*file, device, CpuKernels::kAuto, Recompute::kNone, dtype);
  } else {
    const std::string config_path = request.model_dir + "/config.json";
    const Qwen3Config config = read_qwen3_config(config_path);
    if (is_deepen_export(config_path)) {
      student = load_student_hf(request.model_dir, dtype, device);
    } else {
      const int n = static_cast<int>(config.num_hidden_layers);
      qwen3 = std::make_unique<TeacherStage>(request.model_dir, 0, n, true, true, dtype, device);
      vocab = config.vocab_size;
      logits_of = [&](const at::Tensor& ids) { return qwen3->forward(ids); };
    }
  }
  if (student) {
    vocab = student->spec().vocab_size;
    logits_of = [&](const at::Tensor& ids) { return student->forward(ids); };
  }
  const auto sequences = parse_id_lines(read_file_text(request.ids_path), request.ids_path, vocab);
  at::NoGradGuard no_grad;
  ForwardSummary summary;
  std::vector<std::pair<std::string, at::Tensor>> outputs;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const auto& ids = sequences[i];
    const at::Tensor input =
        at::tensor(at::ArrayRef<int64_t>(ids), at::TensorOptions().dtype(at::kLong)).unsqueeze(0).to(device);
    outputs.emplace_back("logits." + std::to_string(i), logits_of(input)[0].to(at::kCPU, at::kFloat));
    summary.tokens += static_cast<int64_t>(ids.size());
  }
  write_tensors(request.out_path, outputs,
                {{"model", request.model_dir}, {"ids", request.ids_path}, {"dtype", float_dtype_name(request.dtype)}});
  summary.sequences = static_cast<int64_t>(sequences.size());
  summary.vocab_size = vocab;
  summary.device = device.str();
  return summary;
}

ExportSummary export_student_file(const std::string& student_path, const std::string& out_dir) {
  std::string path = student_path;
  if (std::filesystem::is_directory(path)) path += "/student.safetensors";
  if (!std::filesystem::exists(path)) throw InputError(path + ": no such student file");
  const auto student = load_student(path);
  export_student_hf(*student, out_dir);
  ExportSummary s;
  s.dir = out_dir;
  s.norm = option_name(student->spec().norm);
  s.depth = student->depth();
  s.scale_folded = student->spec().norm == NormPlacement::kPreScaled;
  s.transformers_compatible = student->spec().norm == NormPlacement::kPre || s.scale_folded;
  return s;
}

}  // namespace deepen
