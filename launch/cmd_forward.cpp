// `deepen forward`: runs a Hugging Face Qwen3 checkpoint, or a student of any norm placement (its
// export or its own file), on token ids and writes the logits: the user-facing check that a model
// loads and computes right.
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "launch/command_line.h"
#include "model/model_tasks.h"
#include "train/compute_threads.h"

namespace deepen {

void register_forward_command(CLI::App& app) {
  auto request = std::make_shared<ForwardRequest>();
  auto threads = std::make_shared<int64_t>(0);
  CLI::App* cmd = app.add_subcommand(
      "forward",
      "run a Qwen3 checkpoint or a student on token ids; writes F32 logits.<i> [T_i, vocab] per input line");
  cmd->add_option("--model", request->model_dir,
                  "Hugging Face folder (config.json + safetensors; a deepen export of any placement), or a "
                  "student file: a .safetensors file or a folder holding student.safetensors (a run's final/)")
      ->required();
  cmd->add_option("--ids", request->ids_path,
                  "text file: whitespace-separated token ids, one sequence per line (each line is "
                  "run on its own, so lengths may differ)")
      ->required();
  cmd->add_option("--out", request->out_path, "output .safetensors")->required();
  auto dtype = std::make_shared<std::string>("fp32");
  cmd->add_option("--dtype", *dtype, "compute dtype: fp32 | bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("--device", request->device, "auto | cpu | cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--threads", *threads, "CPU intra-op threads (0 = all cores of this process)");
  cmd->callback([request, threads, dtype] {
    request->dtype = parse_float_dtype(*dtype, "--dtype");
    set_compute_threads(*threads);
    const ForwardSummary s = run_forward(*request);
    std::cout << "deepen forward: " << s.sequences << " sequences, " << s.tokens << " tokens, vocab "
              << s.vocab_size << ", on " << s.device << " -> " << request->out_path << "\n";
  });
}

}  // namespace deepen
