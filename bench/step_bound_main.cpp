// `step_bound`: the GEMM bound of one distillation step at given shapes, measured here, as JSON.
//
//   build/bench/step_bound --teacher-layers 4 --student-layers 3 --batch 4 --seq 256      # kd_step_bench's step
//   build/bench/step_bound --teacher-layers 2 --teacher-dtype bf16 --student-layers 2 --student-hidden 512 \
//       --student-heads 8 --student-kv-heads 4 --student-intermediate 1024 --tied --batch 2 --seq 8192
//
// Prints the bound GEMM by GEMM on stderr (bench/step_bound.h) and one JSON line on stdout:
// {"bound_s", "gemm_s", "adamw_s", "parts_s": {...}, "gemms": [...], ...}, for scripts
// (bench/paper_shape_rehearsal.py) to set a step time against. Widths default to the kd bench's
// (hidden 256, 4/2 heads of 64, intermediate 768, V = 151,936).
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>

#include "bench/machine_load.h"
#include "bench/step_bound.h"
#include "train/compute_threads.h"

namespace {

void add_model_options(CLI::App& app, const std::string& who, deepen::ModelShape& m) {
  app.add_option("--" + who + "-layers", m.layers, who + " layers the step runs (the student's depth at the step)");
  app.add_option("--" + who + "-hidden", m.hidden);
  app.add_option("--" + who + "-heads", m.heads);
  app.add_option("--" + who + "-kv-heads", m.kv_heads);
  app.add_option("--" + who + "-head-dim", m.head_dim);
  app.add_option("--" + who + "-intermediate", m.intermediate);
}

}  // namespace

int main(int argc, char** argv) {
  deepen::ModelShape teacher{"teacher", 4, 256, 4, 2, 64, 768, 151936, true};
  deepen::ModelShape student{"student", 3, 256, 4, 2, 64, 768, 151936, false};
  deepen::bench::StepShape shape;
  shape.batch = 4;
  shape.seq = 256;
  std::string teacher_dtype = "fp32", student_dtype = "fp32";
  int64_t threads = 2, vocab = 151936, parameters = 0;
  bool tied = false;
  deepen::bench::BoundOptions bo;
  CLI::App app{"the GEMM bound of one distillation step at these shapes, measured on this machine (JSON on stdout)"};
  add_model_options(app, "teacher", teacher);
  add_model_options(app, "student", student);
  app.add_option("--teacher-dtype", teacher_dtype, "the dtype the teacher's GEMMs run in (teacher.dtype)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--student-dtype", student_dtype)->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_flag("--tied", tied, "the student's head is its embedding (AdamW's parameter count)");
  app.add_option("--parameters", parameters, "the student's parameter count, if not the shapes' (AdamW's bytes)");
  app.add_option("--vocab", vocab);
  app.add_option("--batch", shape.batch);
  app.add_option("--seq", shape.seq);
  app.add_option("--threads", threads);
  app.add_option("--reps", bo.reps, "timed calls per distinct GEMM (the best counts)");
  app.add_option("--max-gemm-bytes", bo.max_gemm_bytes, "larger GEMMs are timed on fewer rows and scaled");
  CLI11_PARSE(app, argc, argv);
  teacher.vocab = student.vocab = vocab;
  student.tied = tied;
  shape.teacher = teacher;
  shape.student = student;
  shape.teacher_dtype = deepen::parse_option<deepen::FloatDtype>(teacher_dtype, "--teacher-dtype");
  shape.student_dtype = deepen::parse_option<deepen::FloatDtype>(student_dtype, "--student-dtype");
  try {
    deepen::set_compute_threads(threads);
    const deepen::bench::StepBound b = deepen::bench::measure_step_bound(shape, parameters, bo);
    std::fprintf(stderr, "load average after measuring: %s\n", deepen::bench::load_average().c_str());
    deepen::bench::print_step_bound(stderr, b);
    nlohmann::json j = deepen::bench::to_json(b);
    j["load_average"] = deepen::bench::load_average();
    std::cout << j.dump() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "step_bound: %s\n", e.what());
    return 1;
  }
}
