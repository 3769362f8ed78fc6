// Faults injected for tests through environment variables: the failures the fault suite
// (tests/e2e/faults.py) must see handled, made on purpose at a chosen step.
#pragma once

#include <memory>
#include <string>

#include "train/batch_source.h"
#include "train/teacher_source.h"

namespace deepen {

// DEEPEN_FAULT_WRONG_BATCH=<student>:<step>: that student trains on another step's batch at that
// step, the desync the logit channel's checksum must catch. Returns `batches` itself when unset;
// otherwise the wrapper, which reads through `batches` (keep it alive).
std::unique_ptr<BatchSource> inject_wrong_batch(std::unique_ptr<BatchSource> batches,
                                                std::unique_ptr<BatchSource>& keep);

// DEEPEN_FAULT_NAN=<student>:<step>[:<run name>]: that student's teacher targets of its first
// micro-batch at that step are NaN, so its loss is (a divergence the guard must stop on every student
// at that step); with a run name, only in that run of a shared teacher's group (`run`: this one's
// run.name). nullptr when unset or for another run; otherwise a source that reads through `teacher`.
std::unique_ptr<TeacherSource> inject_nan_targets(TeacherSource& teacher, const std::string& run = "");

}  // namespace deepen
