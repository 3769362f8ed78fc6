// Unpacked documents: right padding never changes the loss or any gradient, and the step's loss is
// the mean over its real target tokens however they are split into micro-batches and students.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "model/student.h"
#include "train/distill_loss.h"
#include "train/document_batch.h"
#include "train/micro_batch.h"

namespace deepen {
namespace {

using at::Tensor;

constexpr int64_t kVocab = 50;

TEST(DocumentBatch, PadDocumentsWorkedExample) {
  const PaddedDocuments p = pad_documents({{5, 6, 7, 0}, {8, 0}}, 4, 0);
  EXPECT_TRUE(p.inputs.equal(torch::tensor({5, 6, 7, 8, 0, 0}, torch::kLong).view({2, 3})));
  EXPECT_TRUE(p.labels.equal(torch::tensor({6, 7, 0, 0, -1, -1}, torch::kLong).view({2, 3})));
  EXPECT_EQ(target_tokens(p.labels), 4);
  // Truncation: a 6-token document cut to max_len 4 gives 3 targets; pad_to pads further.
  const PaddedDocuments cut = pad_documents({{1, 2, 3, 4, 5, 6}}, 4, 9, 5);
  EXPECT_TRUE(cut.inputs.equal(torch::tensor({1, 2, 3, 9, 9}, torch::kLong).view({1, 5})));
  EXPECT_TRUE(cut.labels.equal(torch::tensor({2, 3, 4, -1, -1}, torch::kLong).view({1, 5})));
  EXPECT_THROW(pad_documents({{1}}, 4, 0), std::invalid_argument);
}

TEST(DocumentBatch, LossDivisorWorkedExample) {
  // 2 students: micro-batches of 30 and 10 targets on student 0, 20 and 20 on student 1.
  EXPECT_DOUBLE_EQ(micro_batch_loss_divisor(30, 2, 80), 80.0 / 60);
  EXPECT_DOUBLE_EQ(micro_batch_loss_divisor(10, 2, 80), 80.0 / 20);
  // Packed windows: every micro-batch the same size -> exactly grad_accum (here 4), as before.
  EXPECT_EQ(micro_batch_loss_divisor(3 * 256, 2, 2 * 4 * 3 * 256), 4.0);
  EXPECT_THROW(micro_batch_loss_divisor(0, 1, 5), std::invalid_argument);
}

// A tiny fp64 student: fp64 keeps the reassociation error of the comparisons below far under
// their tolerance (see kTolerance), so a real leak of padding into a result cannot hide in it.
std::shared_ptr<GrowableStudent> tiny_student(NormPlacement norm) {
  StudentSpec spec;
  spec.decoder = DecoderSpec{.hidden = 32, .heads = 4, .kv_heads = 2, .head_dim = 8, .intermediate = 48,
                             .rope_theta = 10000.0, .rms_eps = 1e-6, .cpu_kernels = CpuKernels::kAten};
  spec.vocab_size = kVocab;
  spec.max_depth = 2;
  spec.norm = norm;
  spec.tie_embeddings = false;
  spec.dtype = at::kDouble;
  return std::make_shared<GrowableStudent>(spec, 2, 7);
}

// Three documents (EOS = 0 last) of 6, 11 and 3 tokens: 5, 10 and 2 targets.
std::vector<std::vector<int64_t>> documents() {
  std::vector<std::vector<int64_t>> docs;
  for (int64_t n : {6, 11, 3}) {
    std::vector<int64_t> d;
    for (int64_t t = 0; t + 1 < n; ++t) d.push_back(1 + (n * 7 + t * 13) % (kVocab - 1));
    d.push_back(0);
    docs.push_back(d);
  }
  return docs;
}

// Teacher logits for the batch: each document's positions get fixed logits (seeded by the
// document itself) wherever the batch puts it; padded positions get fresh noise, different for
// every padded length, so a padded position that leaked into the loss would change it.
Tensor teacher_logits(const PaddedDocuments& batch, uint64_t noise_seed) {
  const int64_t rows = batch.inputs.size(0), cols = batch.inputs.size(1);
  torch::manual_seed(static_cast<int64_t>(noise_seed));
  Tensor out = torch::randn({rows, cols, kVocab}, torch::kDouble) * 5.0;
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t n = batch.labels[b].ne(kIgnoreLabel).sum().item<int64_t>();
    torch::manual_seed(1000 + n * 64 + batch.inputs[b][0].item<int64_t>());
    out[b].narrow(0, 0, n).copy_(torch::randn({n, kVocab}, torch::kDouble) * 2.0);
  }
  return out.view({rows * cols, kVocab});
}

struct LossAndGrads {
  double loss = 0;
  int64_t tokens = 0;
  std::vector<std::pair<std::string, Tensor>> grads;
};

// The trainer's step on micro-batches of `docs` split at `split` (documents [0, split) and
// [split, end)), each padded to `pad_to`: the distillation loss of every micro-batch divided by
// micro_batch_loss_divisor, then backward, as train/student_trainer.cpp does.
LossAndGrads step(NormPlacement norm, const std::vector<std::vector<int64_t>>& docs, size_t split, int64_t pad_to,
                  uint64_t noise_seed) {
  auto student = tiny_student(norm);
  std::vector<std::vector<std::vector<int64_t>>> micro;
  if (split > 0) micro.emplace_back(docs.begin(), docs.begin() + long(split));
  if (split < docs.size()) micro.emplace_back(docs.begin() + long(split), docs.end());
  std::vector<PaddedDocuments> batches;
  int64_t step_tokens = 0;
  for (const auto& m : micro) {
    batches.push_back(pad_documents(m, 64, 0, pad_to));
    step_tokens += target_tokens(batches.back().labels);
  }
  DistillLossOptions o;
  o.alpha = 0.7;  // the paper's mix: KL and CE both see the padding
  o.row_chunk = 16;
  o.ignore_index = kIgnoreLabel;
  LossAndGrads out;
  out.tokens = step_tokens;
  uint64_t seed = noise_seed;
  for (const PaddedDocuments& b : batches) {
    const Tensor hidden = student->forward_hidden(b.inputs);
    const DistillLoss l = distill_loss(hidden, student->head_weight(), TeacherTargets::full(teacher_logits(b, seed++)),
                                       b.labels, o);
    const Tensor weighted = l.loss / micro_batch_loss_divisor(l.tokens.item<int64_t>(), 1, step_tokens);
    weighted.backward();
    out.loss += weighted.item<double>();
  }
  out.grads = student->named_trainable_parameters();
  return out;
}

// Padding adds exact zeros (padded positions have loss weight 0, so their upstream gradient is 0
// and 0·x = 0); only the order in which the kernels add the same nonzero terms can move, because
// rows shift with the padded length. Reassociating a sum of n terms moves it by at most
// (n − 1)·u·Σ|terms| (u = 2^-53 in fp64). The longest sums here are n ≤ 3 rows × 64 positions
// = 192 terms, nested through 2 blocks and the loss (< 20 such sums deep), with Σ|terms| within
// 10^3 of the result's norm for these O(1) activations: 192 · 20 · 10^3 · 2^-53 ≈ 4e-10.
constexpr double kTolerance = 4e-10;

double rel_diff(const Tensor& a, const Tensor& b) {
  return ((a - b).norm() / b.norm().clamp_min(1e-300)).item<double>();
}

void expect_same(const LossAndGrads& a, const LossAndGrads& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  EXPECT_NEAR(a.loss, b.loss, kTolerance * std::abs(b.loss)) << what;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_TRUE(a.grads[i].second.grad().defined()) << what << " " << a.grads[i].first;
    EXPECT_LE(rel_diff(a.grads[i].second.grad(), b.grads[i].second.grad()), kTolerance)
        << what << ": gradient of " << a.grads[i].first;
  }
}

TEST(DocumentBatch, PaddingNeverChangesTheLossOrAnyGradient) {
  for (NormPlacement norm : {NormPlacement::kPre, NormPlacement::kPost}) {
    const std::string name = norm == NormPlacement::kPre ? "pre" : "post";
    // The batch padded to its longest member (10 inputs) vs the same documents padded to 37.
    const LossAndGrads tight = step(norm, documents(), 3, 0, 11);
    const LossAndGrads loose = step(norm, documents(), 3, 37, 99);
    EXPECT_EQ(tight.tokens, 17);
    expect_same(loose, tight, name + " padded to 37");
  }
}

TEST(DocumentBatch, StepLossIsTheTokenMeanHoweverDocumentsAreSplitIntoMicroBatches) {
  // One micro-batch of the three documents, vs [doc 0] + [docs 1, 2], vs each document alone
  // (no padding at all: the reference for what the padded batch must compute).
  const LossAndGrads one = step(NormPlacement::kPre, documents(), 3, 0, 1);
  const LossAndGrads two = step(NormPlacement::kPre, documents(), 1, 0, 2);
  expect_same(two, one, "split 1 + 2");
  auto student = tiny_student(NormPlacement::kPre);
  double loss = 0;
  int64_t tokens = 0;
  for (const auto& d : documents()) tokens += int64_t(d.size()) - 1;
  for (const auto& d : documents()) {
    LossAndGrads alone = step(NormPlacement::kPre, {d}, 1, 0, 3);
    loss += alone.loss * double(alone.tokens) / double(tokens);
  }
  EXPECT_NEAR(loss, one.loss, kTolerance * one.loss);
}

}  // namespace
}  // namespace deepen
