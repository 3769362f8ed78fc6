// TinyWorld: byte-tokenized synthetic shards and a random 2-layer Qwen3 teacher (a Hugging Face
// folder) in a fresh temporary folder, plus the 3-stage grow config the trainer tests run on it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/text_file.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "launch/job_plan.h"
#include "launch/local_job.h"
#include "model/student.h"
#include "model/student_io.h"
#include "tests/test_paths.h"

namespace deepen::test {

// Job options for tests: no per-step progress lines.
inline JobOptions quiet() {
  JobOptions o;
  o.print_progress = false;
  return o;
}

// The run plan a single-process `deepen train` of `cfg` makes (students folded into grad_accum).
inline RunPlan local_plan(const Config& cfg, const Tokenizer& tokenizer) {
  return plan_single_process_job(cfg, true, tokenizer, 0).run();
}

inline constexpr const char* kTinyStudentShape = R"(
[student]
layers = 3
hidden = 32
heads = 4
kv_heads = 2
head_dim = 8
intermediate = 64
)";

class TinyWorld {
 public:
  TinyWorld() {
    root_ = std::filesystem::temp_directory_path() /
            ("deepen_tiny_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ / "train");
    std::filesystem::create_directories(root_ / "valid");
    auto tok = make_tokenizer("bytes");
    write_split(*tok, root_ / "train" / "00000.bin", 1, 20000);
    write_split(*tok, root_ / "valid" / "00000.bin", 2, 4000);
    const Config tcfg = parse_config(std::string(kTinyStudentShape) + "[curriculum]\nmode = \"joint\"\nstages = [2]\n",
                                     "teacher", {"student.layers=2"});
    GrowableStudent teacher(student_spec_from_config(tcfg.student, tok->padded_vocab_size()), 2, 99);
    export_student_hf(teacher, teacher_dir());
  }
  ~TinyWorld() { std::filesystem::remove_all(root_); }
  TinyWorld(const TinyWorld&) = delete;
  TinyWorld& operator=(const TinyWorld&) = delete;

  std::string teacher_dir() const { return (root_ / "teacher").string(); }
  std::filesystem::path dir(const std::string& name) const { return root_ / name; }

  // tests/fixtures/tiny_run.toml on this world: a 3-stage grow run (1, 2, 3 blocks, 3 steps each),
  // evals every 4 steps and at stage ends, diagnostics every 4, checkpoints every 2 steps. The
  // device is explicit: the exact-equality tests run on the CPU (some GPU reductions add in varying
  // order).
  std::string toml(const std::string& name, const std::string& device = "cpu") const {
    return fill_placeholders(read_file_text(kTinyRunToml, "test fixture"),
                             {{"name", name},
                              {"out_dir", dir(name).string()},
                              {"device", device},
                              {"train", (root_ / "train").string()},
                              {"valid", (root_ / "valid").string()},
                              {"teacher", teacher_dir()},
                              {"keep", "10"}});
  }
  Config config(const std::string& name, const std::vector<std::string>& sets = {},
                const std::string& device = "cpu") const {
    return parse_config(toml(name, device), name + ".toml", sets);
  }

 private:
  // Sentences with structure (so a model can learn something) from a seeded generator. Every line
  // is a document in the shard's index (data.packing = "documents"); the token stream is the same
  // as without the index, so packed windows read what they always read.
  static void write_split(const Tokenizer& tok, const std::filesystem::path& path, unsigned seed, size_t bytes) {
    const char* words[] = {"the", "growth", "of", "a", "student", "follows", "teacher", "norm", "block", "layer"};
    std::mt19937 gen(seed);
    std::string text;
    std::vector<int32_t> ids;
    std::vector<uint64_t> ends;
    while (text.size() < bytes) {
      std::string word = words[gen() % 10];
      word += (gen() % 7 == 0) ? ".\n" : " ";
      text += word;
      const std::vector<int32_t> w = tok.encode(word);
      ids.insert(ids.end(), w.begin(), w.end());
      if (word.back() == '\n') ends.push_back(ids.size());
    }
    write_shard(path.string(), ids, static_cast<uint64_t>(tok.vocab_size()), tok.fingerprint(), ends);
  }
  // `text` with every {key} of `values` replaced; a placeholder left over is a broken fixture.
  static std::string fill_placeholders(std::string text, const std::map<std::string, std::string>& values) {
    for (const auto& [key, value] : values)
      for (size_t at = text.find("{" + key + "}"); at != std::string::npos; at = text.find("{" + key + "}", at + value.size()))
        text.replace(at, key.size() + 2, value);
    if (const size_t left = text.find('{'); left != std::string::npos)
      throw std::logic_error(std::string(kTinyRunToml) + ": no value for " + text.substr(left, text.find('}', left) - left + 1));
    return text;
  }
  std::filesystem::path root_;
};

}  // namespace deepen::test
