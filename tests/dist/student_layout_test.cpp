// The rank layout of a run from a teacher cache: students only, no pipeline and no logit channel.
#include <gtest/gtest.h>

#include "config/config.h"
#include "dist/rank_layout.h"
#include "tests/test_support.h"

namespace deepen {
namespace {

TEST(StudentLayout, EveryRankIsAStudentInOneGroup) {
  ParallelConfig p;
  p.teacher_pipelines = 2;  // not used: no teacher ranks
  p.teacher_stages = 3;
  p.students = 4;
  const RankLayout l = make_student_layout(p, 4);
  EXPECT_EQ(l.teacher_ranks(), 0);
  EXPECT_EQ(l.group_count(GroupKind::kLogitChannel), 0);
  EXPECT_EQ(l.group_ranks(GroupKind::kStudents), (std::vector<int>{0, 1, 2, 3}));
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(l.ranks[r].is_student());
    EXPECT_EQ(l.student_rank(r), r);
    EXPECT_FALSE(l.slot(r, GroupKind::kLogitChannel).member());
    EXPECT_FALSE(l.slot(r, GroupKind::kTeacherPipeline).member());
    EXPECT_EQ(l.slot(r, GroupKind::kStudents), (GroupSlot{0, r}));
  }
  EXPECT_NE(l.describe().find("targets from the teacher cache"), std::string::npos);
  EXPECT_TRUE(check_placement(l, {"a", "a", "b", "b"}).empty());
  EXPECT_NE(test::error_of([&] { make_student_layout(p, 6); }).find("a run from a teacher cache has no teacher ranks"),
            std::string::npos);
}

}  // namespace
}  // namespace deepen
