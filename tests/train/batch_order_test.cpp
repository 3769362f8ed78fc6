// Batch order: the worked example, and the properties both sides rely on (each student's items are
// its pipeline's items in the same order; every eval batch is evaluated exactly once).
#include <gtest/gtest.h>

#include <map>

#include "train/batch_order.h"

namespace deepen {
namespace {

std::string describe(const std::vector<BatchKey>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ", ") + k.describe();
  return out;
}

TEST(BatchOrder, HeaderExample) {
  const BatchCounts counts{2, 2, 3};
  EXPECT_EQ(describe(step_batches(counts, 3, true, 0, 2)),
            "train step 3 student 0 micro 0, train step 3 student 1 micro 0, train step 3 student 0 micro 1, "
            "train step 3 student 1 micro 1, eval step 3 student 0 batch 0, eval step 3 student 1 batch 1, "
            "eval step 3 student 0 batch 2");
  EXPECT_EQ(describe(step_batches(counts, 3, true, 1, 1)),
            "train step 3 student 1 micro 0, train step 3 student 1 micro 1, eval step 3 student 1 batch 1");
  // No eval after the step: train batches only.
  EXPECT_EQ(step_batches(counts, 4, false, 0, 2).size(), 4u);
}

TEST(BatchOrder, EachStudentConsumesItsPipelinesItemsInTheSameOrder) {
  for (int64_t T : {1, 2, 3}) {
    for (int64_t per : {1, 2, 3}) {
      const int64_t S = T * per;
      for (int64_t accum : {1, 3}) {
        for (int64_t evals : {0, 1, 5, 7}) {
          const BatchCounts counts{S, accum, evals};
          std::map<int64_t, int64_t> evaluated;  // eval batch -> how many students evaluate it
          for (int64_t p = 0; p < T; ++p) {
            const auto produced = step_batches(counts, 9, true, p * per, per);
            for (int64_t s = p * per; s < (p + 1) * per; ++s) {
              std::vector<BatchKey> mine;
              for (const auto& k : produced)
                if (k.student == s) mine.push_back(k);
              EXPECT_EQ(mine, step_batches(counts, 9, true, s, 1)) << "T=" << T << " S=" << S << " student " << s;
            }
            for (const auto& k : produced) {
              EXPECT_EQ(k.step, 9);
              if (k.kind == BatchKind::kEval) {
                ++evaluated[k.index];
                EXPECT_EQ(k.student, eval_batch_owner(k.index, S));
              }
            }
          }
          EXPECT_EQ(static_cast<int64_t>(evaluated.size()), evals);
          for (const auto& [batch, n] : evaluated) EXPECT_EQ(n, 1) << "eval batch " << batch;
        }
      }
    }
  }
}

// Full sharding's students meet in an all-gather inside every micro-batch: a pipeline must have
// produced every one of its students' micro-batch m before any micro-batch m + 1.
TEST(BatchOrder, EveryStudentsMicroBatchComesBeforeAnyStudentsNext) {
  for (int64_t per : {1, 2, 4})
    for (int64_t accum : {1, 3}) {
      const auto items = step_batches({2 * per, accum, 0}, 5, false, per, per);
      ASSERT_EQ(static_cast<int64_t>(items.size()), per * accum);
      for (size_t i = 0; i < items.size(); ++i) {
        EXPECT_EQ(items[i].index, static_cast<int64_t>(i) / per) << "item " << i;
        EXPECT_EQ(items[i].student, per + static_cast<int64_t>(i) % per) << "item " << i;
      }
    }
}

TEST(BatchOrder, TrainItemsComeBeforeEvalItemsAndEvalStepsFollowTheSchedule) {
  const auto items = step_batches({4, 2, 9}, 0, true, 0, 4);
  bool seen_eval = false;
  for (const auto& k : items) {
    if (k.kind == BatchKind::kEval) seen_eval = true;
    else EXPECT_FALSE(seen_eval) << "a train item after an eval item";
  }
  Config cfg;
  cfg.eval.every = 4;
  GrowthSchedule g;
  g.depths = {1, 2, 3};
  g.stage_steps = {3, 3, 3};
  g.stage_begin = {0, 3, 6};
  std::vector<int64_t> evals;
  for (int64_t s = 0; s < 9; ++s)
    if (is_eval_step(cfg, g, s)) evals.push_back(s);
  EXPECT_EQ(evals, (std::vector<int64_t>{2, 3, 5, 7, 8}));
}

}  // namespace
}  // namespace deepen
