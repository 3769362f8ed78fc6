// TinyWorld: byte-tokenized synthetic shards and a random 2-layer Qwen3 teacher (a Hugging Face
// folder) in a fresh temporary folder, plus the 3-stage grow config the trainer tests run on it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "launch/job_plan.h"
#include "launch/local_job.h"
#include "model/student.h"
#include "model/student_io.h"

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

  // A 3-stage grow run (1, 2, 3 blocks, 3 steps each), evals every 4 steps and at stage ends,
  // diagnostics every 4, checkpoints every 2 steps. The device is explicit: the exact-equality
  // tests run on the CPU (some GPU reductions add in varying order).
  std::string toml(const std::string& name, const std::string& device = "cpu") const {
    return R"(
[run]
threads = 1
name = ")" + name + R"("
out_dir = ")" + dir(name).string() + R"("
device = ")" + device + R"("
[data]
tokenizer = "bytes"
seq_len = 32
train = ")" + (root_ / "train").string() + R"("
valid = ")" + (root_ / "valid").string() + R"("
[teacher]
checkpoint = ")" + teacher_dir() + R"("
)" + kTinyStudentShape + R"(
[curriculum]
mode = "grow"
stages = [1, 2, 3]
stage_steps = [3, 3, 3]
[optim]
lr = 3e-3
warmup_steps = 2
[parallel]
micro_batch = 2
grad_accum = 2
[eval]
every = 4
batches = 2
diagnostics_every = 4
diagnostic_batch = 2
[checkpoint]
every = 2
keep = 10
)";
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
  std::filesystem::path root_;
};

}  // namespace deepen::test
