// `deepen forward` and `deepen export` as library functions.
#include "model/model_tasks.h"

#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/Context.h>

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

ForwardSummary run_forward(const ForwardRequest& request) {
  const at::ScalarType dtype = to_scalar_type(request.dtype);
  const at::Device device = pick_device(request.device);
  const Qwen3Config config = read_qwen3_config(request.model_dir + "/config.json");
  const auto sequences = parse_id_lines(read_file_text(request.ids_path), request.ids_path, config.vocab_size);
  const int n = static_cast<int>(config.num_hidden_layers);
  TeacherStage model(request.model_dir, 0, n, true, true, dtype, device);
  ForwardSummary summary;
  std::vector<std::pair<std::string, at::Tensor>> outputs;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const auto& ids = sequences[i];
    const at::Tensor input =
        at::tensor(at::ArrayRef<int64_t>(ids), at::TensorOptions().dtype(at::kLong)).unsqueeze(0);
    outputs.emplace_back("logits." + std::to_string(i), model.forward(input)[0].to(at::kCPU, at::kFloat));
    summary.tokens += static_cast<int64_t>(ids.size());
  }
  write_tensors(request.out_path, outputs,
                {{"model", request.model_dir}, {"ids", request.ids_path}, {"dtype", float_dtype_name(request.dtype)}});
  summary.sequences = static_cast<int64_t>(sequences.size());
  summary.vocab_size = config.vocab_size;
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
  s.transformers_compatible = student->spec().norm == NormPlacement::kPre;
  return s;
}

}  // namespace deepen
