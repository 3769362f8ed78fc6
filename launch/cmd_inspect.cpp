// `deepen inspect PATH`: lists the tensors of a .safetensors file or HF checkpoint folder (validating
// every file) and, when the folder has a Qwen3 config.json, checks each tensor against it.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>
#include <string>

#include <CLI/CLI.hpp>

#include "launch/command_line.h"
#include "model/hf_config.h"
#include "model/hf_names.h"
#include "model/safetensors.h"

namespace deepen {

namespace {

struct InspectOptions {
  std::string path;
  bool no_check = false;
};

std::string human_bytes(uint64_t n) {
  char buf[32];
  if (n < (1u << 20)) std::snprintf(buf, sizeof buf, "%.1f KiB", n / 1024.0);
  else if (n < (1ull << 30)) std::snprintf(buf, sizeof buf, "%.1f MiB", n / 1048576.0);
  else std::snprintf(buf, sizeof buf, "%.2f GiB", n / 1073741824.0);
  return buf;
}

void inspect(const InspectOptions& opts, std::ostream& out) {
  namespace fs = std::filesystem;
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(opts.path);
  const auto names = ckpt.names();
  size_t name_width = 4;
  for (const auto& n : names) name_width = std::max(name_width, n.size());

  // Every shard is opened (so validated) here: inspect is the command that vouches for a folder.
  uint64_t total_bytes = 0;
  int64_t total_elements = 0;
  std::set<std::string> files;
  for (const auto& n : names) files.insert(ckpt.file_of(n));
  const bool sharded = files.size() > 1;
  // One row per tensor: name, dtype, shape, bytes (and the shard when there are several).
  auto row = [&](const std::string& name, const std::string& dtype, const std::string& shape, const std::string& bytes,
                 const std::string& file) {
    std::string s(name);
    s.resize(name_width + 2, ' ');
    s += dtype;
    s.resize(name_width + 2 + 7, ' ');
    s += shape;
    s.resize(std::max(s.size() + 1, name_width + 2 + 7 + 22), ' ');
    s += std::string(bytes.size() < 12 ? 12 - bytes.size() : 0, ' ') + bytes;
    if (sharded) s += "  " + file;
    out << s << "\n";
  };
  row("name", "dtype", "shape", "bytes", "file");
  for (const auto& n : names) {
    const TensorInfo& info = ckpt.info(n);
    total_bytes += info.nbytes;
    total_elements += info.numel();
    row(n, dtype_name(info.dtype), shape_string(info.shape), std::to_string(info.nbytes),
        fs::path(ckpt.file_of(n)).filename().string());
  }
  out << opts.path << ": " << names.size() << " tensors, " << total_elements << " elements, " << total_bytes
      << " bytes (" << human_bytes(total_bytes) << ") in " << files.size() << (files.size() == 1 ? " file" : " files")
      << "\n";
  if (files.size() == 1) {
    // Metadata is per file; for a single file it describes the whole checkpoint.
    const auto file = SafetensorsFile::open(*files.begin());
    for (const auto& [k, v] : file.metadata()) out << "metadata " << k << " = " << v << "\n";
  }

  const fs::path config = fs::path(opts.path) / "config.json";
  if (opts.no_check || !fs::is_directory(opts.path) || !fs::exists(config)) return;
  const Qwen3Config c = read_qwen3_config(config.string());
  out << config.string() << ": qwen3, " << c.num_hidden_layers << " layers, hidden " << c.hidden_size
      << ", intermediate " << c.intermediate_size << ", heads " << c.num_attention_heads << " (kv "
      << c.num_key_value_heads << "), head_dim " << c.head_dim << ", vocab " << c.vocab_size
      << (c.tie_word_embeddings ? ", tied head" : ", untied head") << ", rope_theta " << c.rope_theta
      << (c.torch_dtype.empty() ? "" : ", dtype " + c.torch_dtype) << "\n";
  const auto expected = expected_all_tensors(c);
  std::set<std::string> known;
  for (const auto& e : expected) {
    check_expected_tensor(ckpt, e);  // InputError on the first mismatch: exit 2
    known.insert(e.name);
  }
  size_t extra = 0;
  for (const auto& n : names)
    if (!known.count(n)) {
      out << "note: " << n << " is not a Qwen3 tensor; deepen ignores it\n";
      ++extra;
    }
  out << "all " << expected.size() << " tensors the config implies are present with the right shapes"
      << (extra ? " (" + std::to_string(extra) + " extra ignored)" : "") << "\n";
}

}  // namespace

void register_inspect_command(CLI::App& app) {
  auto opts = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "list tensors (dtype, shape, bytes) of a .safetensors file or HF checkpoint folder, validating "
                 "every file; with a config.json, check each tensor's shape against it (exit 2 on bad input)");
  cmd->add_option("PATH", opts->path, ".safetensors file, or folder with model.safetensors[.index.json]")->required();
  cmd->add_flag("--no-check", opts->no_check, "do not check tensors against the folder's config.json");
  cmd->callback([opts] { inspect(*opts, std::cout); });
}

}  // namespace deepen
