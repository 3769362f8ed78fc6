// `deepen export`: writes a saved student as a Hugging Face folder (config.json + model.safetensors).
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "config/config.h"
#include "launch/command_line.h"
#include "model/model_tasks.h"
#include "run_folder/run_folder.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;

// curriculum.block_layers of the run a student file belongs to (RUN/final/..., or
// RUN/checkpoints/step_N/...: the folder above `final` or `checkpoints`, from its config.toml);
// nullopt for a student file outside a run folder. The student file itself knows only its layers.
std::optional<int64_t> block_layers_of_run(const std::string& student_path) {
  for (fs::path p = fs::absolute(student_path).lexically_normal(); p.has_relative_path(); p = p.parent_path()) {
    if (!RunFolder::is_inner_folder(p.filename().string())) continue;
    const RunFolder run(p.parent_path().string());
    if (!fs::is_regular_file(run.config_toml())) return std::nullopt;
    try {
      return load_config(run.config_toml()).curriculum.block_layers;
    } catch (const std::exception&) {
      return std::nullopt;  // the blocks only annotate the line: a config this build cannot read leaves them out
    }
  }
  return std::nullopt;
}

// The student's depth in layers, and in blocks when the run's block size is known and divides it.
// Examples: (4, 2) -> "4 layers (2 blocks of 2)"; (4, 1) -> "4 layers"; (1, none) -> "1 layer".
std::string depth_text(int64_t layers, std::optional<int64_t> block_layers) {
  std::string text = std::to_string(layers) + (layers == 1 ? " layer" : " layers");
  if (block_layers && *block_layers > 1 && layers % *block_layers == 0)
    text += " (" + std::to_string(layers / *block_layers) + (layers / *block_layers == 1 ? " block" : " blocks") +
            " of " + std::to_string(*block_layers) + ")";
  return text;
}

}  // namespace

void register_export_command(CLI::App& app) {
  auto student = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "export", "write a student as a Hugging Face folder (pre and pre_scaled load as Qwen3ForCausalLM; "
                "peri and mix are refused)");
  cmd->add_option("--checkpoint", *student,
                  "student file written by deepen (save_student), or a folder holding "
                  "student.safetensors")
      ->required();
  cmd->add_option("--out", *out, "output folder (replaced atomically)")->required();
  cmd->callback([student, out] {
    const ExportSummary s = export_student_file(*student, *out);
    std::cout << "deepen export: " << s.norm << "-norm student, " << depth_text(s.depth, block_layers_of_run(*student))
              << " -> " << s.dir << "\n";
    if (s.scale_folded)
      std::cout << "note: pre_scaled student: each layer's 1/sqrt(l) is folded into its norm gains; "
                   "transformers' Qwen3 runs it as trained.\n";
    if (!s.transformers_compatible)
      std::cout << "note: post-norm student; config.json records \"deepen_norm\": \"post\". "
                   "transformers' Qwen3 (pre-norm) cannot run it: load the weights with deepen.\n";
  });
}

}  // namespace deepen
