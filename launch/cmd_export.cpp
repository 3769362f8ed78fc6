// `deepen export`: writes a saved student as a Hugging Face folder (config.json + model.safetensors).
#include <iostream>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "launch/command_line.h"
#include "model/model_tasks.h"

namespace deepen {

void register_export_command(CLI::App& app) {
  auto student = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "export", "write a student as a Hugging Face folder (pre-norm loads as Qwen3ForCausalLM)");
  cmd->add_option("--checkpoint", *student,
                  "student file written by deepen (save_student), or a folder holding "
                  "student.safetensors")
      ->required();
  cmd->add_option("--out", *out, "output folder (replaced atomically)")->required();
  cmd->callback([student, out] {
    const ExportSummary s = export_student_file(*student, *out);
    std::cout << "deepen export: " << s.norm << "-norm student, " << s.depth << " blocks -> " << s.dir
              << "\n";
    if (!s.transformers_compatible)
      std::cout << "note: post-norm student; config.json records \"deepen_norm\": \"post\". "
                   "transformers' Qwen3 (pre-norm) cannot run it: load the weights with deepen.\n";
  });
}

}  // namespace deepen
