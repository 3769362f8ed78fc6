// Diagnostics pass on the fixed diagnostic batch (student 0 only: every student is identical):
// residual scale per token class, the last layer's identity mapping, block-boundary RMS per token
// type, and at phase ends block removal.
#include <ATen/ATen.h>

#include "diagnostics/block_boundary_rms.h"
#include "diagnostics/block_removal.h"
#include "diagnostics/boundary_diagnostics.h"
#include "data/tokenizer.h"
#include "train/batch_source.h"
#include "train/micro_batch.h"
#include "train/trainer.h"

namespace deepen {
void Trainer::diagnose(int64_t step, int stage, const char* event) {
  at::NoGradGuard no_grad;
  const std::string kind = event;
  const MicroBatch mb = run_.batches->diagnostic();
  // Classes stay on the CPU: the diagnostics bring the per-token statistics there to average them.
  const at::Tensor classes = token_classes(mb.inputs, mb.labels);
  const at::Tensor types = token_types(mb.inputs, mb.labels, run_.tokenizer->eos_id());
  const std::vector<at::Tensor> stream = student_->residual_stream(mb.inputs.to(device_));
  const int64_t depth = student_->depth();
  // Blocks as the curriculum appends them (the paper: 3 layers); the schedule's depths are whole blocks.
  const int64_t L = cfg_.curriculum.block_layers;
  // stream = [entering layer 0, ..., entering layer depth-1, output of the last layer]: the last
  // entry is the boundary representation an appended block would receive.
  const std::vector<at::Tensor> entering(stream.begin(), stream.end() - 1);
  nlohmann::json record;
  record["residual"] = to_json(residual_scale(entering, stream.back(), classes));
  record["identity_last_block"] = to_json(identity_mapping(stream[static_cast<size_t>(depth - L)], stream.back(), classes));
  const std::vector<at::Tensor> boundaries = block_boundaries(stream, L);
  nlohmann::json rms = nlohmann::json::array();
  for (const BoundaryRms& b : block_boundary_rms(boundaries, types)) rms.push_back(to_json(b));
  record["block_layers"] = L;
  record["block_rms"] = rms;
  if (kind != "periodic") record["block_removal"] = to_json(block_removal(*student_, mb.inputs.to(device_), mb.labels, L));
  record["step"] = step;
  record["stage"] = stage;
  record["depth"] = depth;
  record["event"] = kind;
  write_records([&] { records_->diagnostics(record); });
  if (kind == "final") {
    // Every non-padding token's RMS at every boundary, by type: the distribution the summaries
    // above condense (the report's histogram).
    nlohmann::json per_boundary = nlohmann::json::array();
    for (const at::Tensor& x : boundaries) {
      const at::Tensor r = per_token_rms(x);
      per_boundary.push_back({{"document_boundary", values_of_type(r, types, TokenType::kDocumentBoundary)},
                              {"regular", values_of_type(r, types, TokenType::kRegular)}});
    }
    write_records([&] {
      records_->final_token_rms({{"step", step}, {"depth", depth}, {"block_layers", L}, {"boundaries", per_boundary}});
    });
  }
}

double Trainer::diagnostic_ce() {
  at::NoGradGuard no_grad;
  const MicroBatch mb = run_.batches->diagnostic();
  const CeSum ce = cross_entropy_sum(student_->forward_hidden(mb.inputs.to(device_)), student_->head_weight(),
                                     mb.labels.to(device_));
  return ce.tokens > 0 ? ce.sum / static_cast<double>(ce.tokens) : 0;
}

void Trainer::record_growth(int64_t step, int stage, int64_t depth_before, double ce_before, double ce_after) {
  write_records([&] {
    records_->diagnostics({{"step", step},
                           {"stage", stage},
                           {"depth", student_->depth()},
                           {"event", "grown"},
                           {"depth_before", depth_before},
                           {"grow_init", option_name(cfg_.curriculum.grow_init)},
                           {"ce_before", ce_before},
                           {"ce_after", ce_after}});
  });
}

at::Tensor Trainer::token_classes(const at::Tensor& inputs, const at::Tensor& labels) const {
  const at::Tensor ids = inputs.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor padded = labels.to(at::kCPU, at::kLong).eq(kIgnoreLabel).contiguous();
  const bool* pad = padded.data_ptr<bool>();
  at::Tensor classes = at::empty(ids.sizes(), at::kLong);
  const int64_t rows = ids.size(0), cols = ids.size(1);
  const int64_t* in = ids.data_ptr<int64_t>();
  int64_t* out = classes.data_ptr<int64_t>();
  std::vector<int32_t> row(static_cast<size_t>(cols));
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t t = 0; t < cols; ++t) row[static_cast<size_t>(t)] = static_cast<int32_t>(in[b * cols + t]);
    const std::vector<TokenClass> c = classify_tokens(*run_.tokenizer, row);
    for (int64_t t = 0; t < cols; ++t)
      out[b * cols + t] = pad[b * cols + t] ? kPaddingTokenClass : static_cast<int64_t>(c[static_cast<size_t>(t)]);
  }
  return classes;
}

}  // namespace deepen
