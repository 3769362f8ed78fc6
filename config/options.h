// The enumerated options of a config: one enum per option, its spellings, the one parser of them.
#pragma once

#include <array>
#include <cstddef>
#include <ostream>
#include <string>
#include <string_view>

#include "config/float_dtype.h"

namespace deepen {

// An option's spellings live only in its OptionSpelling: names[i] spells the enum value i. Parsing
// (the config, --set, a study file, a command-line flag) goes through parse_option and printing
// through option_name, so no code outside config/ compares an option's text, and a misspelt value
// fails at load time listing the allowed ones.
template <class E> struct OptionSpelling;

template <class E> concept Option = requires { OptionSpelling<E>::names; };

// run.device: where models and batches live ("auto" = CUDA when this process sees a GPU).
enum class RunDevice { kAuto, kCpu, kCuda };
template <> struct OptionSpelling<RunDevice> { static constexpr std::array names{"auto", "cpu", "cuda"}; };

// data.packing: packed token windows, or one document per sequence (the paper's protocol).
enum class Packing { kWindows, kDocuments };
template <> struct OptionSpelling<Packing> { static constexpr std::array names{"windows", "documents"}; };

// teacher.cpu_kernels, student.cpu_kernels: fp32 CPU steps (model/cpu_kernel_choice.h).
enum class CpuKernels { kAuto, kFused, kAten };
template <> struct OptionSpelling<CpuKernels> { static constexpr std::array names{"auto", "fused", "aten"}; };

// student.norm: where RMSNorm sits relative to the residual add (model/norm_placement.h):
// pre (Qwen3), post, peri (a norm on each sub-layer's input and output), mix (post-norm for the
// first ceil(student.mix_post_fraction x student.layers) layers, pre-norm after), pre_scaled (pre-norm,
// each norm's output times 1/sqrt(l) for the 1-based layer index l).
enum class NormPlacement { kPre, kPost, kPeri, kMix, kPreScaled };
template <> struct OptionSpelling<NormPlacement> {
  static constexpr std::array names{"pre", "post", "peri", "mix", "pre_scaled"};
};

// student.init: every weight drawn, or the paper's student (embedding, head and boundary norm from
// the teacher; model/student_from_teacher.h).
enum class StudentInit { kRandom, kTeacher };
template <> struct OptionSpelling<StudentInit> { static constexpr std::array names{"random", "teacher"}; };

// student.precision: the student's arithmetic (model/student.h).
enum class StudentPrecision { kFp32, kBf16Mixed, kBf16Pure };
template <> struct OptionSpelling<StudentPrecision> {
  static constexpr std::array names{"fp32", "bf16-mixed", "bf16-pure"};
};

// student.recompute: activation recomputation (model/recompute.h).
enum class Recompute { kNone, kLayer, kMlp };
template <> struct OptionSpelling<Recompute> { static constexpr std::array names{"none", "layer", "mlp"}; };

// curriculum.mode: depth grows stage by stage, or full depth from step 0.
enum class CurriculumMode { kGrow, kJoint };
template <> struct OptionSpelling<CurriculumMode> { static constexpr std::array names{"grow", "joint"}; };

// curriculum.grow_init: the growth operator, how appended blocks start (curriculum/growth_operator.h):
// random (the config's init), stack (a copy of the student's own last block), identity (random with
// the output projections zeroed), teacher (the teacher's layers each new layer maps to).
enum class GrowInit { kRandom, kStack, kIdentity, kTeacher };
template <> struct OptionSpelling<GrowInit> {
  static constexpr std::array names{"random", "stack", "identity", "teacher"};
};

// curriculum.phase_policy: AdamW state and LR schedule at a stage start.
enum class PhasePolicy { kKeep, kReset };
template <> struct OptionSpelling<PhasePolicy> { static constexpr std::array names{"keep", "reset"}; };

// distill.logits: what the teacher's last stage sends each student per token.
enum class TeacherOutput { kFull, kTopk, kHidden };
template <> struct OptionSpelling<TeacherOutput> { static constexpr std::array names{"full", "topk", "hidden"}; };

// distill.tail: the teacher's mass outside its top k (train/distill_loss.h).
enum class TopkTail { kRenormalize, kBucket };
template <> struct OptionSpelling<TopkTail> { static constexpr std::array names{"renormalize", "bucket"}; };

// distill.source: where a run's teacher targets come from: a live teacher (in this process or on
// teacher ranks), or a teacher cache written by `deepen cache` (teacher_cache/, docs/cache.md).
enum class DistillSource { kTeacher, kCache };
template <> struct OptionSpelling<DistillSource> { static constexpr std::array names{"teacher", "cache"}; };

// cache.targets: which of a cache's stored targets a run trains on: the K samples of the teacher's
// distribution (RS-KD, unbiased) or the top-k log-probabilities (biased; for comparison).
enum class CacheTargets { kSampled, kTopk };
template <> struct OptionSpelling<CacheTargets> { static constexpr std::array names{"sampled", "topk"}; };

// optim.schedule: the LR's shape after warmup (curriculum/lr_schedule.h).
enum class LrShape { kCosine, kConstant };
template <> struct OptionSpelling<LrShape> { static constexpr std::array names{"cosine", "constant"}; };

// parallel.backend: the world communicator's library (dist/run_device.h resolves "auto").
enum class Backend { kAuto, kMpi, kNccl };
template <> struct OptionSpelling<Backend> { static constexpr std::array names{"auto", "mpi", "nccl"}; };

// parallel.rank_order: which world rank is which (dist/rank_layout.h).
enum class RankOrder { kRoles, kPipelines };
template <> struct OptionSpelling<RankOrder> { static constexpr std::array names{"roles", "pipelines"}; };

// parallel.sharding: the students' data parallelism (train/sharded_adamw.h).
enum class Sharding { kNone, kGradOp, kFull };
template <> struct OptionSpelling<Sharding> { static constexpr std::array names{"none", "grad_op", "full"}; };

// guard.action: what a non-finite loss or gradient norm, or a loss spike, does (train/divergence_guard.h).
enum class GuardAction { kStop, kSkip, kRollback };
template <> struct OptionSpelling<GuardAction> { static constexpr std::array names{"stop", "skip", "rollback"}; };

// A study run's command and launcher (study/study_plan.h).
enum class StudyCommand { kTrain, kPretrain };
template <> struct OptionSpelling<StudyCommand> { static constexpr std::array names{"train", "pretrain"}; };
// study.teacher: the runs' targets from a live teacher each (or shared: study.share_teacher), or from
// one teacher cache the study writes first (study/study_plan.h).
enum class StudyTeacher { kLive, kCache };
template <> struct OptionSpelling<StudyTeacher> { static constexpr std::array names{"live", "cache"}; };
enum class Launcher { kAuto, kMpirun, kDirect };
template <> struct OptionSpelling<Launcher> { static constexpr std::array names{"auto", "mpirun", "direct"}; };
// How a study forms its shared-teacher groups (study/teacher_groups.h): in the study's order, runs of
// equal length only (a group holds its devices for its longest run), or as its [[group]] lists say
// (what `deepen plan --study` recommends).
enum class GroupBy { kOrder, kLength, kListed };
template <> struct OptionSpelling<GroupBy> { static constexpr std::array names{"order", "length", "listed"}; };

template <> struct OptionSpelling<FloatDtype> { static constexpr std::array names{"fp32", "bf16"}; };

template <Option E> const char* option_name(E value) {
  return OptionSpelling<E>::names[static_cast<size_t>(value)];
}

// Printed as spelt: `std::cout << cfg.parallel.sharding` prints grad_op.
template <Option E> std::ostream& operator<<(std::ostream& os, E value) { return os << option_name(value); }

// The allowed spellings as an error shows them. Example: Sharding -> "none" | "grad_op" | "full".
template <Option E> std::string option_choices() {
  std::string out;
  for (const char* name : OptionSpelling<E>::names) out += (out.empty() ? "\"" : " | \"") + std::string(name) + "\"";
  return out;
}

[[noreturn]] void throw_unknown_option(const std::string& where, const std::string& choices, std::string_view got);

// The value `text` spells; anything else throws InputError naming `where` (file and key) and the
// choices. Example: parse_option<Packing>("document", "x.toml: data.packing") throws
//   x.toml: data.packing: must be "windows" | "documents", got "document"
template <Option E> E parse_option(std::string_view text, const std::string& where) {
  const auto& names = OptionSpelling<E>::names;
  for (size_t i = 0; i < names.size(); ++i)
    if (text == names[i]) return static_cast<E>(i);
  throw_unknown_option(where, option_choices<E>(), text);
}

}  // namespace deepen
