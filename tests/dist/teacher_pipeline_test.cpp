// The teacher pipeline produces train/batch_order.h's order: each student's items, in its order.
#include <gtest/gtest.h>

#include "dist/rank_layout.h"
#include "dist/teacher_pipeline.h"
#include "train/batch_order.h"

namespace deepen {
namespace {

TEST(TeacherPipeline, ProducesEachStudentsBatchesInTheTrainersOrder) {
  Config cfg = parse_config("[student]\nlayers = 3\n[curriculum]\nmode = \"grow\"\nstage_steps = [3, 3, 3]\n", "p.toml",
                            {"parallel.teacher_pipelines=2", "parallel.students=4", "parallel.grad_accum=2",
                             "eval.every=4", "eval.batches=5"});
  const GrowthSchedule schedule = make_growth_schedule(cfg);
  const RunPlan plan = make_run_plan(cfg, schedule, 256);
  const RankLayout layout = make_rank_layout(cfg.parallel, 6, 4);
  const BatchCounts counts{4, 2, 5};
  for (int64_t step = 0; step < schedule.total_steps(); ++step) {
    for (int p = 0; p < 2; ++p) {
      std::vector<BatchKey> items;
      for (const TeacherItem& item : pipeline_items({ServedRun{&plan, nullptr, 0, schedule.total_steps()}}, layout, p, step)) {
        // One run: one delivery per pass, to the student whose key it is.
        ASSERT_EQ(item.to.size(), 1u);
        EXPECT_EQ(item.to.front().run, 0);
        EXPECT_EQ(item.to.front().key, item.key);
        items.push_back(item.key);
      }
      EXPECT_EQ(items, step_batches(counts, step, is_eval_step(cfg, schedule, step), 2 * p, 2)) << "step " << step;
      for (int64_t s = 2 * p; s < 2 * p + 2; ++s) {
        std::vector<BatchKey> mine;
        for (const auto& k : items)
          if (k.student == s) mine.push_back(k);
        // What the trainer of student s consumes at this step (train/student_trainer.cpp).
        EXPECT_EQ(mine, step_batches(counts, step, is_eval_step(cfg, schedule, step), s, 1)) << "student " << s;
      }
    }
  }
}

}  // namespace
}  // namespace deepen
