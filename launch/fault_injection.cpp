// Test faults from the environment (see fault_injection.h): wrong batches, NaN teacher targets.
#include "launch/fault_injection.h"

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "config/input_error.h"

namespace deepen {
namespace {

// "<student>:<step>[:<run name>]" from `var`; false when unset, or when it names another run than
// `run` (a shared teacher's group: one run's fault).
bool student_and_step(const char* var, int64_t& student, int64_t& step, const std::string& run = "") {
  const char* spec = std::getenv(var);
  if (!spec) return false;
  long long s = 0, t = 0;
  int used = 0;
  if (std::sscanf(spec, "%lld:%lld%n", &s, &t, &used) != 2)
    throw InputError(std::string(var) + ": expected <student>:<step>[:<run name>], got " + spec);
  const std::string rest = spec + used;
  if (!rest.empty() && (rest[0] != ':' || rest.substr(1) != run)) return false;
  student = s;
  step = t;
  return true;
}

class WrongBatchAt : public BatchSource {
 public:
  WrongBatchAt(const BatchSource& inner, int64_t student, int64_t step) : inner_(inner), student_(student), step_(step) {}
  MicroBatch train(int64_t step, int64_t student, int64_t micro) const override {
    if (student != student_ || step != step_) return inner_.train(step, student, micro);
    MicroBatch wrong = inner_.train(step + 1, student, micro);
    wrong.step = step;
    return wrong;
  }
  MicroBatch eval(int64_t index) const override { return inner_.eval(index); }
  int64_t eval_batches() const override { return inner_.eval_batches(); }
  MicroBatch diagnostic() const override { return inner_.diagnostic(); }
  std::vector<int64_t> identity(const BatchKey& key) const override {
    if (key.kind != BatchKind::kTrain || key.student != student_ || key.step != step_) return inner_.identity(key);
    BatchKey wrong = key;
    ++wrong.step;
    return inner_.identity(wrong);
  }

 private:
  const BatchSource& inner_;
  int64_t student_, step_;
};

class NanTargetsAt : public TeacherSource {
 public:
  NanTargetsAt(TeacherSource& inner, int64_t student, int64_t step) : inner_(inner), student_(student), step_(step) {}
  TeacherTargets targets(const MicroBatch& batch) override {
    TeacherTargets t = inner_.targets(batch);
    if (batch.kind != BatchKind::kTrain || batch.student != student_ || batch.step != step_ || batch.index != 0) return t;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (at::Tensor* x : {&t.logits, &t.values, &t.hidden, &t.entropy})
      if (x->defined()) *x = at::full_like(*x, nan);
    return t;
  }
  void prefetch(const MicroBatch& next) override { inner_.prefetch(next); }
  std::string describe() const override { return inner_.describe(); }
  int64_t channel_bytes() const override { return inner_.channel_bytes(); }

 private:
  TeacherSource& inner_;
  int64_t student_, step_;
};

}  // namespace

std::unique_ptr<BatchSource> inject_wrong_batch(std::unique_ptr<BatchSource> batches,
                                                std::unique_ptr<BatchSource>& keep) {
  int64_t student = 0, step = 0;
  if (!student_and_step("DEEPEN_FAULT_WRONG_BATCH", student, step)) return batches;
  keep = std::move(batches);
  return std::make_unique<WrongBatchAt>(*keep, student, step);
}

std::unique_ptr<TeacherSource> inject_nan_targets(TeacherSource& teacher, const std::string& run) {
  int64_t student = 0, step = 0;
  if (!student_and_step("DEEPEN_FAULT_NAN", student, step, run)) return nullptr;
  return std::make_unique<NanTargetsAt>(teacher, student, step);
}

}  // namespace deepen
