// Who may share a teacher pass, and the groups a study's runs fall into.
#include <gtest/gtest.h>

#include "config/config.h"
#include "study/group_file.h"
#include "study/teacher_groups.h"
#include "tests/test_support.h"

namespace deepen {
namespace {

Config config(std::vector<std::string> sets) { return parse_config("", "base.toml", sets); }

TEST(TeacherShare, StudentSideSettingsMayDiffer) {
  const Config a = config({"student.norm=pre", "curriculum.mode=joint"});
  const Config b = config({"student.norm=post", "student.layers=3", "curriculum.mode=grow", "curriculum.stage_steps=[2,2,2]",
                           "optim.lr=0.01", "eval.every=7", "checkpoint.every=3"});
  EXPECT_EQ(teacher_share_difference(a, b), std::nullopt);
}

TEST(TeacherShare, SeedsReadOneOrderOnlyWithAnOrderSeed) {
  const auto why = teacher_share_difference(config({"run.seed=1"}), config({"run.seed=2"}));
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why, "data.order_seed (run.seed when unset): 1 vs 2");
  EXPECT_EQ(teacher_share_difference(config({"run.seed=1", "data.order_seed=7"}), config({"run.seed=2", "data.order_seed=7"})),
            std::nullopt);
}

TEST(TeacherShare, TheTeacherTheDataAndTheBatchesMustBeEqual) {
  const Config base = config({});
  auto why = [&](const std::string& set) { return teacher_share_difference(base, config({set})).value_or(""); };
  EXPECT_NE(why("teacher.dtype=bf16").find("teacher.dtype"), std::string::npos);
  EXPECT_NE(why("data.train=other.bin").find("data.train"), std::string::npos);
  EXPECT_NE(why("parallel.micro_batch=3").find("parallel.micro_batch"), std::string::npos);
  EXPECT_NE(why("parallel.grad_accum=3").find("global batch"), std::string::npos);
  EXPECT_NE(why("eval.batches=9").find("eval.batches"), std::string::npos);
  EXPECT_NE(why("distill.logits=topk").find("distill.logits"), std::string::npos);
  EXPECT_NE(why("parallel.max_in_flight=1").find("parallel.max_in_flight"), std::string::npos);
}

// The worked example of teacher_groups.h.
TEST(TeacherGroups, TheWorkedExampleOfTheHeader) {
  const std::vector<GroupCandidate> c = {
      {"pre-grow/1", config({"run.seed=1"}), {}},  {"post-grow/1", config({"run.seed=1"}), {}},
      {"matched/1", config({"run.seed=1"}), {1}},  {"pre-grow/2", config({"run.seed=2"}), {}},
      {"post-grow/2", config({"run.seed=2"}), {}},
  };
  const std::vector<TeacherGroup> g = group_for_teacher(c);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].members, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(g[1].members, (std::vector<size_t>{2}));
  EXPECT_EQ(g[2].members, (std::vector<size_t>{3, 4}));
  ASSERT_GE(g[0].refused.size(), 2u);
  EXPECT_NE(g[0].refused[0].find("matched/1: waits for post-grow/1, a member"), std::string::npos) << g[0].refused[0];
  EXPECT_NE(g[0].refused[1].find("pre-grow/2: data.order_seed"), std::string::npos) << g[0].refused[1];
}

TEST(TeacherShare, EveryRunMustHaveTheTeachersVocabulary) {
  const auto why = teacher_share_difference(config({}), config({"student.vocab_size=512"}));
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why, "student.vocab_size: 0 vs 512") << "the teacher sends one width of logits to every run";
}

// The paper's lengths (tokens per run, from stage_steps): the second example of teacher_groups.h.
TEST(TeacherGroups, ByLengthOnlyRunsAsLongShare) {
  auto paper = [](std::vector<std::string> sets) {
    sets.insert(sets.begin(), "curriculum.block_layers=3");
    return config(sets);
  };
  const std::vector<GroupCandidate> c = {
      {"joint", paper({"curriculum.mode=joint", "curriculum.stages=[3]", "curriculum.stage_steps=[50]"}), {}},
      {"grow", paper({"curriculum.stages=[1,2,3]", "curriculum.stage_steps=[50,50,50]"}), {}},
      {"single", paper({"student.layers=3", "curriculum.mode=joint", "curriculum.stages=[1]", "curriculum.stage_steps=[50]"}), {}},
      {"longer", paper({"curriculum.mode=joint", "curriculum.stages=[3,3,3]", "curriculum.stage_steps=[50,50,50]"}), {}}};
  const std::vector<TeacherGroup> g = group_for_teacher(c, 0, GroupBy::kLength);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].members, (std::vector<size_t>{0, 2}));
  EXPECT_EQ(g[1].members, (std::vector<size_t>{1, 3}));
  EXPECT_NE(g[0].refused.at(0).find("grow: another length"), std::string::npos) << g[0].refused.at(0);
  EXPECT_EQ(group_for_teacher(c).size(), 1u) << "in the study's order all four share";
  EXPECT_EQ(curriculum_tokens(c[1].config), 3 * curriculum_tokens(c[0].config));
}

TEST(TeacherGroups, ListedGroupsAreTheStudysOwn) {
  std::vector<GroupCandidate> c = {{"a", config({}), {}, "group 0"}, {"b", config({}), {}, "group 1"},
                                   {"c", config({}), {}, "group 0"}, {"d", config({}), {}, ""}};
  const std::vector<TeacherGroup> g = group_for_teacher(c, 0, GroupBy::kListed);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].members, (std::vector<size_t>{0, 2}));
  EXPECT_EQ(g[1].members, (std::vector<size_t>{1}));
  EXPECT_EQ(g[2].members, (std::vector<size_t>{3})) << "a run in no [[group]] trains alone";
}

TEST(TeacherGroups, ACapSplitsAGroup) {
  const std::vector<GroupCandidate> c = {{"a", config({}), {}}, {"b", config({}), {}}, {"c", config({}), {}}};
  const std::vector<TeacherGroup> g = group_for_teacher(c, 2);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[1].members, (std::vector<size_t>{2}));
  EXPECT_NE(g[0].refused.at(0).find("full (2 runs)"), std::string::npos);
}

TEST(GroupFile, ItsTextReadsBackToTheSameSpec) {
  GroupSpec g;
  g.name = "demo-g0";
  g.out_dir = "runs/demo/groups/g0";
  g.runs = {{"configs/demo/base.toml", {"student.norm=pre", "run.name=pre-grow"}}, {"configs/demo/base.toml", {}}};
  const GroupSpec back = parse_group_file(group_file_text(g), "g.toml");
  EXPECT_EQ(back.name, g.name);
  EXPECT_EQ(back.out_dir, g.out_dir);
  ASSERT_EQ(back.runs.size(), 2u);
  EXPECT_EQ(back.runs[0].config, g.runs[0].config);
  EXPECT_EQ(back.runs[0].sets, g.runs[0].sets);
  EXPECT_TRUE(back.runs[1].sets.empty());
}

TEST(GroupFile, BadFilesNameTheFileAndTheKey) {
  using test::error_of;
  EXPECT_NE(error_of([] { parse_group_file("[group]\nout_dir = \"x\"\n", "g.toml"); }).find("g.toml"), std::string::npos);
  const std::string unknown =
      error_of([] { parse_group_file("[group]\nout_dir = \"x\"\ncolour = 1\n[[run]]\nconfig = \"a.toml\"\n", "g.toml"); });
  EXPECT_NE(unknown.find("colour"), std::string::npos) << unknown;
  const std::string no_config = error_of([] { parse_group_file("[group]\nout_dir = \"x\"\n[[run]]\nset = []\n", "g.toml"); });
  EXPECT_NE(no_config.find("config"), std::string::npos) << no_config;
}

}  // namespace
}  // namespace deepen
