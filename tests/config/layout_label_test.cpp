// Layout labels: T x P + S, with a rank order and sharding other than the default named.
#include <gtest/gtest.h>

#include "config/layout_label.h"

namespace deepen {
namespace {

ParallelConfig layout(int64_t T, int64_t P, int64_t S) {
  ParallelConfig p;
  p.teacher_pipelines = T;
  p.teacher_stages = P;
  p.students = S;
  return p;
}

// layout_label.h's examples: the defaults add nothing, so existing labels ("2x1+4") stay as they were.
TEST(LayoutLabel, NamesANonDefaultRankOrderAndShardingAfterTheCounts) {
  ParallelConfig p = layout(2, 1, 4);
  EXPECT_EQ(layout_label(p), "2x1+4");
  p.rank_order = RankOrder::kPipelines;
  EXPECT_EQ(layout_label(p), "2x1+4 pipelines");
  p.sharding = Sharding::kGradOp;
  EXPECT_EQ(layout_label(p), "2x1+4 pipelines grad_op");
  ParallelConfig q = layout(1, 1, 4);
  q.sharding = Sharding::kGradOp;
  EXPECT_EQ(layout_label(q), "1x1+4 grad_op");
  // Settings that do not change which rank holds what leave the label alone.
  q.bucket_cap_mb = 8;
  q.micro_batch = 1;
  q.backend = Backend::kMpi;
  EXPECT_EQ(layout_label(q), "1x1+4 grad_op");
}

}  // namespace
}  // namespace deepen
