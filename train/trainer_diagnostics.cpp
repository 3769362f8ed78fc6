// Diagnostics pass: residual scale per token class and the last block's identity mapping, on the
// fixed diagnostic batch (student 0 only: every student is identical).
#include <ATen/ATen.h>

#include "curriculum/boundary_diagnostics.h"
#include "data/tokenizer.h"
#include "train/batch_source.h"
#include "train/trainer.h"

namespace deepen {

void Trainer::diagnose(int64_t step, int stage, const char* event) {
  at::NoGradGuard no_grad;
  const MicroBatch mb = run_.batches->diagnostic();
  // Classes stay on the CPU: the diagnostics bring the per-token statistics there to average them.
  const at::Tensor classes = token_classes(mb.inputs);
  const std::vector<at::Tensor> stream = student_->residual_stream(mb.inputs.to(device_));
  const int64_t depth = student_->depth();
  // stream = [entering block 0, ..., entering block depth-1, output of the last block]: the last
  // entry is the boundary representation an appended block would receive.
  const std::vector<at::Tensor> entering(stream.begin(), stream.end() - 1);
  nlohmann::json record;
  record["residual"] = to_json(residual_scale(entering, stream.back(), classes));
  record["identity_last_block"] = to_json(identity_mapping(stream[static_cast<size_t>(depth - 1)], stream.back(), classes));
  record["step"] = step;
  record["stage"] = stage;
  record["depth"] = depth;
  record["event"] = event;
  records_->diagnostics(record);
}

at::Tensor Trainer::token_classes(const at::Tensor& inputs) const {
  const at::Tensor ids = inputs.to(at::kCPU, at::kLong).contiguous();
  at::Tensor classes = at::empty(ids.sizes(), at::kLong);
  const int64_t rows = ids.size(0), cols = ids.size(1);
  const int64_t* in = ids.data_ptr<int64_t>();
  int64_t* out = classes.data_ptr<int64_t>();
  std::vector<int32_t> row(static_cast<size_t>(cols));
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t t = 0; t < cols; ++t) row[static_cast<size_t>(t)] = static_cast<int32_t>(in[b * cols + t]);
    const std::vector<TokenClass> c = classify_tokens(*run_.tokenizer, row);
    for (int64_t t = 0; t < cols; ++t) out[b * cols + t] = static_cast<int64_t>(c[static_cast<size_t>(t)]);
  }
  return classes;
}

}  // namespace deepen
