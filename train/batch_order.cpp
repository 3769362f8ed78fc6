// The order of micro-batches between the teacher pipeline and the students (see batch_order.h).
#include "train/batch_order.h"

namespace deepen {
namespace {

const char* kind_name(BatchKind k) {
  switch (k) {
    case BatchKind::kTrain: return "train";
    case BatchKind::kEval: return "eval";
    case BatchKind::kDiagnostic: return "diagnostic";
  }
  return "?";
}

}  // namespace

std::string BatchKey::describe() const {
  return std::string(kind_name(kind)) + " step " + std::to_string(step) + " student " + std::to_string(student) +
         (kind == BatchKind::kTrain ? " micro " : " batch ") + std::to_string(index);
}

int64_t eval_batch_count(const Config& cfg) {
  const int64_t n = cfg.data.valid_documents, b = cfg.parallel.micro_batch;
  if (cfg.data.packing == Packing::kDocuments && n > 0) return (n + b - 1) / b;
  return cfg.eval.batches;
}

std::vector<BatchKey> step_batches(const BatchCounts& counts, int64_t step, bool eval_after, int64_t first_student,
                                   int64_t count) {
  std::vector<BatchKey> items;
  for (int64_t m = 0; m < counts.grad_accum; ++m) {
    for (int64_t s = first_student; s < first_student + count; ++s) items.push_back({BatchKind::kTrain, step, s, m});
  }
  if (eval_after) {
    for (int64_t b = 0; b < counts.eval_batches; ++b) {
      const int64_t owner = eval_batch_owner(b, counts.students);
      if (owner >= first_student && owner < first_student + count) items.push_back({BatchKind::kEval, step, owner, b});
    }
  }
  return items;
}

}  // namespace deepen
