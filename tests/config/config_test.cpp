// Config parsing: typed sections, overrides, and errors that name file, key and reason.
#include <gtest/gtest.h>

#include "config/config.h"
#include "config/input_error.h"
#include "tests/test_support.h"

namespace deepen {
namespace {

const char* kMinimal = R"(
[student]
layers = 3
[curriculum]
mode = "grow"
stage_steps = [10, 10, 10]
)";

std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  return test::error_of([&] { parse_config(text, "x.toml", sets); });
}

TEST(Config, GrowStagesDefaultToOneBlockPerStage) {
  Config cfg = parse_config(kMinimal, "x.toml");
  EXPECT_EQ(cfg.curriculum.stages, (std::vector<int64_t>{1, 2, 3}));
}

TEST(Config, SetOverridesWinOverTheFile) {
  Config cfg = parse_config(kMinimal, "x.toml", {"optim.lr=1e-3", "student.norm=post", "run.name=\"a b\""});
  EXPECT_DOUBLE_EQ(cfg.optim.lr, 1e-3);
  EXPECT_EQ(cfg.student.norm, NormPlacement::kPost);
  EXPECT_EQ(cfg.run.name, "a b");
}

TEST(Config, PrintedConfigParsesBackToTheSameConfig) {
  Config cfg = parse_config(kMinimal, "x.toml", {"optim.betas=[0.8, 0.99]", "data.sources=[\"a\", \"b\"]"});
  Config again = parse_config(to_toml(cfg), "x.toml");
  EXPECT_EQ(to_toml(cfg), to_toml(again));
  EXPECT_EQ(config_hash(cfg), config_hash(again));
}

TEST(Config, UnknownKeyIsNamed) {
  EXPECT_NE(error_of(std::string(kMinimal) + "\n[optim]\nlearning_rate = 1\n").find("x.toml: optim.learning_rate: unknown key"),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"optim.lrr=1"}).find("optim.lrr: unknown key"), std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "\n[bogus]\nx = 1\n").find("[bogus]: unknown section"), std::string::npos);
}

TEST(Config, WrongTypeIsNamed) {
  EXPECT_NE(error_of(kMinimal, {"student.layers=\"three\""}).find("student.layers: expected an integer, got a string"),
            std::string::npos);
}

// A value given on the command line is named as --set, not as a line of the file that never held
// it; a value from the file still names the file.
TEST(Config, ABadSetValueIsNamedAsSetAndAFileValueByTheFile) {
  EXPECT_EQ(error_of(kMinimal, {"optim.lr=\"fast\""}), "--set optim.lr: expected a number, got a string");
  EXPECT_EQ(error_of(kMinimal, {"optim.lr=-1"}), "--set optim.lr: must be > 0, got -1.0");
  EXPECT_EQ(error_of(std::string(kMinimal) + "[optim]\nlr = -1\n"), "x.toml: optim.lr: must be > 0, got -1.0");
  EXPECT_EQ(error_of(kMinimal, {"bogus.key=1"}), "--set bogus.key: unknown section [bogus]");
}

// Collects the "section.key" of every float key a section's visit() lists.
struct FloatKeys {
  std::string section;
  std::vector<std::string>* out;
  void operator()(const char* key, double&) { out->push_back(section + "." + key); }
  void operator()(const char* key, std::vector<double>&) { out->push_back(section + "." + key); }
  template <class T> void operator()(const char*, T&) {}
};

// Every float key: TOML spells inf and nan, and a value past fp32's range (1e308) becomes inf the
// moment it meets a float tensor. Each fails at load time naming its key, from the file or --set.
// The keys are enumerated from the config's own visit(), so a key added later is covered too.
TEST(Config, EveryFloatKeyRefusesInfNanAndValuesPastFp32NamingTheKey) {
  std::vector<std::string> keys;
  Config cfg;
  auto each_section = [&](const char* name, auto& section) {
    FloatKeys visitor{name, &keys};
    section.visit(visitor);
  };
  cfg.visit_sections(each_section);
  ASSERT_GE(keys.size(), 15u);
  for (const std::string& key : keys) {
    const bool list = key == "optim.betas";
    for (const std::string& bad : {"inf", "-inf", "nan", "1e308"}) {
      const std::string value = list ? "[0.9, " + bad + "]" : bad;
      const std::string from_set = error_of(kMinimal, {key + "=" + value});
      EXPECT_NE(from_set.find("--set " + key + (list ? "[1]" : "") + ": must be a finite number within fp32's range"),
                std::string::npos) << from_set;
      const std::string section = key.substr(0, key.find('.')), name = key.substr(key.find('.') + 1);
      const std::string text = section == "student" || section == "curriculum"
                                   ? "" : std::string(kMinimal) + "[" + section + "]\n" + name + " = " + value + "\n";
      if (text.empty()) continue;  // kMinimal holds those sections already; --set covered them
      const std::string from_file = error_of(text);
      EXPECT_NE(from_file.find("x.toml: " + key), std::string::npos) << from_file;
    }
  }
  // The four settings that trained to NaN or silently turned a control off.
  for (const char* set : {"optim.lr=inf", "optim.weight_decay=inf", "optim.weight_decay=nan", "optim.grad_clip=nan"})
    EXPECT_THROW(parse_config(kMinimal, "x.toml", {set}), InputError) << set;
  EXPECT_NO_THROW(parse_config(kMinimal, "x.toml", {"optim.lr=3.4e38"}));
}

TEST(Config, MalformedTomlGivesLineAndColumn) {
  EXPECT_NE(error_of("[student\nlayers = 3\n").find("x.toml:1:"), std::string::npos);
}

TEST(Config, StagesMustEndAtStudentDepth) {
  EXPECT_NE(error_of(kMinimal, {"curriculum.stages=[1, 2]", "curriculum.stage_steps=[1, 1]"})
                .find("curriculum.stages: must end at student.layers = 3, got 2"),
            std::string::npos);
}

// Every placement takes every operator, identity included (where it is not function-preserving its
// change is measured); what cannot be served is named before anything runs.
TEST(Config, EveryPlacementTakesEveryGrowthOperator) {
  for (const char* norm : {"pre", "post", "peri", "mix", "pre_scaled"})
    for (const char* op : {"random", "stack", "identity"})
      EXPECT_NO_THROW(parse_config(kMinimal, "x.toml", {std::string("student.norm=") + norm,
                                                         std::string("curriculum.grow_init=") + op}))
          << norm << " " << op;
}

TEST(Config, TeacherGrowthNeedsTheTeachersStudent) {
  EXPECT_NE(error_of(kMinimal, {"curriculum.grow_init=teacher"})
                .find("curriculum.grow_init: \"teacher\" copies the teacher's layers, which read the teacher's "
                      "embedding: needs student.init = \"teacher\" (got \"random\")"),
            std::string::npos);
}

TEST(Config, RetiredCopyLastNamesItsReplacement) {
  EXPECT_NE(error_of(kMinimal, {"curriculum.grow_init=copy_last"})
                .find("--set curriculum.grow_init: \"copy_last\" is retired: write \"stack\""),
            std::string::npos);
}

TEST(Config, MixPostFractionMustLieInsideZeroOne) {
  for (const char* f : {"0", "1", "-0.1", "1.5"})
    EXPECT_NE(error_of(kMinimal, {"student.norm=mix", std::string("student.mix_post_fraction=") + f})
                  .find("student.mix_post_fraction: must be in (0, 1), got"),
              std::string::npos)
        << f;
  // Inside (0, 1) but every layer post-norm: that is post, not mix.
  EXPECT_NE(error_of(kMinimal, {"student.norm=mix", "student.mix_post_fraction=0.9"})
                .find("student.mix_post_fraction: 0.9 makes all 3 layers post-norm (ceil(fraction x layers) = 3)"),
            std::string::npos);
  EXPECT_NO_THROW(parse_config(kMinimal, "x.toml", {"student.norm=mix", "student.mix_post_fraction=0.5"}));
}

TEST(Config, MixPostLayersIsTheCeilingOfFractionTimesLayers) {
  EXPECT_EQ(mix_post_layers(9, 0.25), 3);
  EXPECT_EQ(mix_post_layers(12, 0.25), 3);
  EXPECT_EQ(mix_post_layers(9, 0.5), 5);
  EXPECT_EQ(mix_post_layers(9, 1.0 / 3.0), 3);
  EXPECT_EQ(mix_post_layers(9, 0.3333333333), 3);
  EXPECT_EQ(mix_post_layers(3, 0.01), 1);
}

TEST(Config, StudentsMustDivideAmongPipelines) {
  EXPECT_NE(error_of(kMinimal, {"parallel.teacher_pipelines=2", "parallel.students=3"}).find("parallel.students"),
            std::string::npos);
}

TEST(Config, DocumentPackingKeysAreValidatedAndNamed) {
  const Config cfg = parse_config(kMinimal, "x.toml",
                                  {"data.packing=\"documents\"", "data.max_len=8192", "data.replay_shard_tokens=3110000000",
                                   "data.valid_documents=4833"});
  EXPECT_EQ(cfg.data.packing, Packing::kDocuments);
  EXPECT_EQ(cfg.data.max_len, 8192);
  EXPECT_EQ(cfg.data.replay_shard_tokens, 3110000000);
  EXPECT_EQ(cfg.data.valid_documents, 4833);
  EXPECT_EQ(Config{}.data.packing, Packing::kWindows);  // today's packed windows stay the default
  EXPECT_NE(error_of(kMinimal, {"data.packing=\"packed\""}).find("--set data.packing: must be \"windows\" | \"documents\""),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"data.replay_shard_tokens=100"})
                .find("--set data.replay_shard_tokens: needs data.packing = \"documents\""),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"data.valid_documents=10"}).find("data.valid_documents: needs data.packing"),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"data.packing=\"documents\"", "data.max_len=0"}).find("data.max_len: must be >= 1"),
            std::string::npos);
}

TEST(Config, LossRowChunkIsAutoByDefaultAndNeverNegative) {
  EXPECT_EQ(Config{}.distill.row_chunk, 0);  // 0 = from the memory budget (train/loss_chunking.h)
  EXPECT_EQ(parse_config(kMinimal, "x.toml", {"distill.row_chunk=256"}).distill.row_chunk, 256);
  EXPECT_NE(error_of(kMinimal, {"distill.row_chunk=-1"}).find("--set distill.row_chunk: must be >= 0"), std::string::npos);
}

TEST(Config, CountsTakeSuffixes) {
  EXPECT_EQ(parse_count("50M"), 50'000'000);
  EXPECT_EQ(parse_count("2.5B"), 2'500'000'000);
  EXPECT_EQ(parse_count("1234"), 1234);
  EXPECT_THROW(parse_count("12x"), std::invalid_argument);
  EXPECT_THROW(parse_count("1.5"), std::invalid_argument);
}

TEST(Config, BlockLayersCountStagesInBlocks) {
  Config cfg = parse_config(kMinimal, "x.toml", {"student.layers=9", "curriculum.block_layers=3"});
  EXPECT_EQ(cfg.curriculum.stages, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(stage_depths(cfg.curriculum), (std::vector<int64_t>{3, 6, 9}));
  EXPECT_NE(error_of(kMinimal, {"student.layers=8", "curriculum.block_layers=3"})
                .find("curriculum.block_layers: must divide student.layers = 8, got 3"),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"student.layers=9", "curriculum.block_layers=3", "curriculum.stages=[1, 2]",
                                "curriculum.stage_steps=[1, 1]"})
                .find("must end at student.layers / curriculum.block_layers = 9 / 3 = 3 blocks, got 2"),
            std::string::npos);
}

TEST(Config, JointRunsMayHavePhasesAtFullDepthOnly) {
  Config cfg = parse_config(kMinimal, "x.toml", {"curriculum.mode=joint", "curriculum.stages=[3, 3]",
                                                 "curriculum.stage_steps=[5, 5]", "curriculum.phase_policy=reset"});
  EXPECT_EQ(cfg.curriculum.stages, (std::vector<int64_t>{3, 3}));
  EXPECT_NE(error_of(kMinimal, {"curriculum.mode=joint", "curriculum.stages=[2, 3]", "curriculum.stage_steps=[5, 5]"})
                .find("curriculum.stages: a joint run trains at full depth in every phase"),
            std::string::npos);
}

TEST(Config, PhasePolicyAndTeacherInitAreChecked) {
  EXPECT_NE(error_of(kMinimal, {"curriculum.phase_policy=restart"}).find("curriculum.phase_policy: must be"),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"curriculum.phase_policy=reset", "curriculum.rewarmup_steps=10"})
                .find("curriculum.rewarmup_steps: must be 0 with curriculum.phase_policy = \"reset\""),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"student.init=teacher"}).find("student.tie_embeddings: must be false"),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"student.init=copy"}).find("student.init: must be"), std::string::npos);
  const Config cfg = parse_config(kMinimal, "x.toml", {"student.init=teacher", "student.tie_embeddings=false"});
  EXPECT_EQ(cfg.student.init, StudentInit::kTeacher);
  EXPECT_TRUE(cfg.curriculum.freeze_head_and_norm);  // the literal reading is the default
  EXPECT_EQ(cfg.curriculum.phase_policy, PhasePolicy::kKeep);    // today's behaviour is the default
}

// The header's example, and keys that differ nowhere are not listed.
TEST(Config, DifferencesNameEachKeyWithBothValues) {
  const Config a = parse_config(kMinimal, "a.toml", {"curriculum.stage_steps=[3, 3, 3]"});
  const Config b = parse_config(kMinimal, "b.toml", {"curriculum.stage_steps=[3, 3, 4]"});
  const auto d = config_differences(a, b);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].key, "curriculum.stage_steps");
  EXPECT_EQ(d[0].a, "[3, 3, 3]");
  EXPECT_EQ(d[0].b, "[3, 3, 4]");
  EXPECT_TRUE(config_differences(a, a).empty());
}

// Speed, memory and rounding settings are stripped; anything that changes what is trained is kept.
TEST(Config, WithoutExecutionSettingsKeepsOnlyWhatIsTrained) {
  const Config a = parse_config(kMinimal, "a.toml");
  const Config b = parse_config(kMinimal, "b.toml",
                                {"run.threads=2", "run.device=\"cpu\"", "student.cpu_kernels=\"aten\"",
                                 "teacher.cpu_kernels=\"fused\"", "student.recompute=\"layer\"", "control.watchdog_s=7",
                                 "student.tf32=true", "run.tensorboard=true", "distill.row_chunk=64"});
  EXPECT_EQ(config_differences(a, b).size(), 9u);
  EXPECT_TRUE(config_differences(without_execution_settings(a), without_execution_settings(b)).empty());
  const Config c = parse_config(kMinimal, "c.toml", {"run.threads=2", "curriculum.stage_steps=[10, 10, 11]"});
  const auto d = config_differences(without_execution_settings(a), without_execution_settings(c));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].key, "curriculum.stage_steps");
  // The precision changes what the optimizer holds and how it rounds every step: kept.
  const Config e = parse_config(kMinimal, "e.toml", {"student.precision=\"bf16-mixed\""});
  ASSERT_EQ(config_differences(without_execution_settings(a), without_execution_settings(e)).size(), 1u);
}

// A scaling study keeps the global batch and changes the student count: grad_accum follows.
TEST(Config, GlobalBatchDerivesGradAccumFromTheLayout) {
  const std::vector<std::pair<int64_t, int64_t>> students_accum = {{1, 8}, {2, 4}, {4, 2}, {8, 1}};
  for (const auto& [students, accum] : students_accum) {
    const Config cfg = parse_config(kMinimal, "x.toml", {"parallel.global_batch=16", "parallel.micro_batch=2",
                                                         "parallel.students=" + std::to_string(students)});
    EXPECT_EQ(cfg.parallel.grad_accum, accum) << students << " students";
    // The resolved config, as saved in the run folder, loads back to itself.
    EXPECT_TRUE(config_differences(parse_config(to_toml(cfg), "saved.toml"), cfg).empty());
  }
  // Without it, grad_accum is what the file says.
  EXPECT_EQ(parse_config(kMinimal, "x.toml", {"parallel.grad_accum=3"}).parallel.grad_accum, 3);
}

TEST(Config, GlobalBatchThatDoesNotDivideIsNamedWithTheLayout) {
  const std::string e = error_of(kMinimal, {"parallel.global_batch=16", "parallel.micro_batch=2", "parallel.students=3"});
  EXPECT_NE(e.find("x.toml: parallel.global_batch: 16 sequences do not divide"), std::string::npos) << e;
  EXPECT_NE(e.find("parallel.students = 3 x parallel.micro_batch = 2 = 6"), std::string::npos) << e;
}

TEST(Config, GradAccumThatContradictsTheGlobalBatchIsAnError) {
  const std::string e =
      error_of(kMinimal, {"parallel.global_batch=16", "parallel.micro_batch=2", "parallel.students=2", "parallel.grad_accum=2"});
  EXPECT_NE(e.find("x.toml: parallel.grad_accum: 2 contradicts parallel.global_batch = 16"), std::string::npos) << e;
  EXPECT_NE(e.find("grad_accum 4"), std::string::npos) << e;
  // Agreeing is fine (a saved config.toml holds the derived value beside global_batch).
  EXPECT_EQ(parse_config(kMinimal, "x.toml", {"parallel.global_batch=16", "parallel.micro_batch=2",
                                              "parallel.students=2", "parallel.grad_accum=4"})
                .parallel.grad_accum,
            4);
}

// Checkpoints resume across layouts that keep the global batch, not across a changed batch.
TEST(Config, WithoutLayoutKeepsTheGlobalBatchAndDropsTheRanks) {
  const Config four = parse_config(kMinimal, "a.toml", {"parallel.global_batch=8", "parallel.micro_batch=2",
                                                        "parallel.students=4", "parallel.teacher_pipelines=2",
                                                        "parallel.rank_order=\"pipelines\""});
  const Config two = parse_config(kMinimal, "b.toml", {"parallel.micro_batch=2", "parallel.grad_accum=2",
                                                       "parallel.students=2", "parallel.teacher_stages=2",
                                                       "parallel.backend=\"mpi\""});
  EXPECT_FALSE(config_differences(four, two).empty());
  EXPECT_TRUE(config_differences(without_layout(four), without_layout(two)).empty());
  EXPECT_EQ(without_layout(two).parallel.global_batch, 8);
  const Config bigger = parse_config(kMinimal, "c.toml", {"parallel.micro_batch=2", "parallel.grad_accum=3",
                                                          "parallel.students=2"});
  const auto d = config_differences(without_layout(two), without_layout(bigger));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].key, "parallel.global_batch");
  // The eval batches are micro-batches: a changed micro_batch is a changed run.
  const Config wider = parse_config(kMinimal, "d.toml", {"parallel.micro_batch=4", "parallel.students=2"});
  EXPECT_EQ(config_differences(without_layout(two), without_layout(wider)).size(), 1u);
}

// The rank order is a layout setting: one of two names, written out with the resolved config.
TEST(Config, RankOrderIsRolesOrPipelinesAndRoundTrips) {
  EXPECT_EQ(parse_config(kMinimal, "x.toml").parallel.rank_order, RankOrder::kRoles);
  const Config c = parse_config(kMinimal, "x.toml", {"parallel.rank_order=\"pipelines\""});
  EXPECT_EQ(c.parallel.rank_order, RankOrder::kPipelines);
  EXPECT_NE(to_toml(c).find("rank_order = \"pipelines\""), std::string::npos) << to_toml(c);
  EXPECT_EQ(parse_config(to_toml(c), "resolved.toml").parallel.rank_order, RankOrder::kPipelines);
  const std::string e = error_of(kMinimal, {"parallel.rank_order=\"colocated\""});
  EXPECT_NE(e.find("--set parallel.rank_order: must be \"roles\" | \"pipelines\", got \"colocated\""),
            std::string::npos)
      << e;
}

// Sharding: two strategies, "full" refused naming what is built instead; the bucket size must be
// positive; the overlap switch and both keys round-trip, and none of them blocks a resume.
TEST(Config, ShardingIsNoneGradOpOrFullAndFullNeedsLayerRecompute) {
  const Config c = parse_config(kMinimal, "x.toml",
                                {"parallel.sharding=\"grad_op\"", "parallel.bucket_cap_mb=0.5",
                                 "parallel.overlap_grad_reduce=false"});
  const Config back = parse_config(to_toml(c), "resolved.toml");
  EXPECT_EQ(back.parallel.sharding, Sharding::kGradOp);
  EXPECT_EQ(back.parallel.bucket_cap_mb, 0.5);
  EXPECT_FALSE(back.parallel.overlap_grad_reduce);
  EXPECT_EQ(to_toml(without_layout(c)), to_toml(without_layout(parse_config(kMinimal, "x.toml"))));
  // "full" with layer recomputation round-trips and leaves the resume hash's settings alone.
  const Config full = parse_config(kMinimal, "x.toml", {"parallel.sharding=\"full\"", "student.recompute=\"layer\""});
  EXPECT_EQ(parse_config(to_toml(full), "resolved.toml").parallel.sharding, Sharding::kFull);
  EXPECT_EQ(to_toml(without_layout(without_execution_settings(full))),
            to_toml(without_layout(without_execution_settings(parse_config(kMinimal, "x.toml")))));
  const std::string no_recompute = error_of(kMinimal, {"parallel.sharding=\"full\""});
  EXPECT_NE(no_recompute.find("--set parallel.sharding: \"full\" needs student.recompute = \"layer\" (got \"none\")"),
            std::string::npos)
      << no_recompute;
  EXPECT_NE(no_recompute.find("use \"grad_op\""), std::string::npos) << no_recompute;
  const std::string other = error_of(kMinimal, {"parallel.sharding=\"zero3\""});
  EXPECT_NE(other.find("parallel.sharding: must be \"none\" | \"grad_op\" | \"full\", got \"zero3\""), std::string::npos)
      << other;
  const std::string bucket = error_of(kMinimal, {"parallel.bucket_cap_mb=0"});
  EXPECT_NE(bucket.find("parallel.bucket_cap_mb: must be > 0"), std::string::npos) << bucket;
}

// [guard] (train/divergence_guard.h): out-of-range settings name their key; the default stops.
TEST(Config, GuardSettingsOutsideTheirRangeNameTheKey) {
  EXPECT_EQ(parse_config(kMinimal, "x.toml").guard.action, GuardAction::kStop);
  EXPECT_NE(error_of(kMinimal, {"guard.spike_factor=0.5"}).find("--set guard.spike_factor: must be 0 (off) or > 1"),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"guard.rollback_lr_factor=1.0"}).find("guard.rollback_lr_factor: must be in (0, 1)"),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"guard.lr_scale=0"}).find("guard.lr_scale"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"guard.action=\"retry\""}).find("guard.action"), std::string::npos);
  EXPECT_EQ(parse_config(kMinimal, "x.toml", {"guard.action=\"rollback\""}).guard.action, GuardAction::kRollback);
}

}  // namespace
}  // namespace deepen

namespace deepen {
namespace {

// data.order_seed: the data order's seed apart from the initialisation's (config.h's example).
TEST(DataOrderSeed, DefaultsToTheRunSeedSoExistingRunsDoNotChange) {
  EXPECT_EQ(data_order_seed(parse_config("", "x.toml", {"run.seed=3"})), 3);
  EXPECT_EQ(data_order_seed(parse_config("", "x.toml", {"run.seed=3", "data.order_seed=42"})), 42);
  EXPECT_NE(test::error_of([] { parse_config("", "x.toml", {"data.order_seed=-2"}); }).find("data.order_seed"),
            std::string::npos);
}

}  // namespace
}  // namespace deepen
