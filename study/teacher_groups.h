// Teacher groups: which runs of a study may share one teacher pass, and why the others may not.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"

namespace deepen {

// The teacher's output for a micro-batch depends only on the micro-batch's token ids and on the
// teacher; what travels to a student depends on the channel too. So two runs may share a teacher pass
// when, micro-batch for micro-batch, the same teacher would get the same ids and send the same thing:
//   teacher   teacher.checkpoint, teacher.dtype, teacher.cpu_kernels, parallel.activation_dtype
//   channel   distill.logits, distill.channel_dtype, student.vocab_size (the rows the teacher
//             sends for each token); with "topk" also distill.topk, distill.tail,
//             distill.temperature and distill.vocab_chunk (they shape the top-k values)
//   data      data.tokenizer, data.train, data.valid, data.packing, data.seq_len (windows) or
//             data.max_len (documents), data.valid_documents
//   batches   parallel.micro_batch, the global batch (students × micro_batch × grad_accum),
//             eval.batches (the eval set's batches), and the data order: data_order_seed(cfg)
//   one job   the group is one job of T·P + R·S ranks, so the layout and how it runs are shared:
//             parallel.teacher_pipelines, teacher_stages, students, rank_order, backend,
//             max_in_flight, run.device and [control]
// What may differ: everything a student alone decides (its shape, norm placement, curriculum, budget
// in steps, optimizer, freeze, sharding, eval.every, checkpoints, seed of its initialisation when
// data.order_seed fixes the order), and data.replay_shard_tokens: runs with different replay shards
// read the same documents until the smaller shard wraps back to its start, where a joint control
// reads fresh documents. From there the teacher computes each distinct micro-batch once per step
// and sends it to every run that reads it (dist/teacher_schedule.h compares the micro-batches'
// identities, so equal ones still cost one pass).
//
// Example (the demo study, one seed): pre/post × joint/grow, post-joint-long, post-joint-longer and
// pre/post-freeze differ only in [student] and [curriculum]: one group of eight. With seeds [1, 2]
// and data.order_seed unset, the two seeds read two orders: two groups of eight. A run whose
// curriculum.budget is another run's active-layer tokens must wait for that run: it goes to a later
// group.

// The first setting that keeps `b` from sharing a teacher pass with `a`, as "key: value in a vs value
// in b", or nullopt when they may share.
// Example: a.run.seed = 1, b.run.seed = 2, order_seed unset in both ->
//   "data.order_seed (run.seed when unset): 1 vs 2"
std::optional<std::string> teacher_share_difference(const Config& a, const Config& b);

// One run of a grouping's input: its name, config, and the runs it must wait for (by index).
struct GroupCandidate {
  std::string name;
  Config config;
  std::vector<size_t> depends_on;  // indices of earlier candidates
  std::string listed;              // GroupBy::kListed: the study's [[group]] it is listed in ("": none)
};

// The training tokens a run's curriculum gives (stage_tokens, or stage_steps x the global batch's
// tokens), or 0 when its length is another run's budget (known once that run has finished).
// Example: stage_steps [50000, 50000, 50000], 64 sequences of 2,048 tokens per step -> 1.97e10.
double curriculum_tokens(const Config& cfg);

struct TeacherGroup {
  std::vector<size_t> members;  // indices into the candidates, in order
  // Candidates that might have joined but could not, with the reason ("post-joint-matched/seed1:
  // waits for post-grow/seed1, a member"; "pre-grow/seed2: data.order_seed ...: 1 vs 2").
  std::vector<std::string> refused;
};

// Pure: candidates (in an order where every run comes after the runs it depends on) into groups that
// run one after another. Each candidate joins the first group whose members it may share with
// (teacher_share_difference) and that comes after every group holding a run it depends on; else it
// starts a new group. `max_runs` caps a group's size (0 = no cap). With GroupBy::kLength a candidate
// joins only a group of runs as long as itself (curriculum_tokens): a group holds its devices until
// its longest run ends, so pairing a 50k-step run with a 150k-step one pays 100k steps of idle
// students (plan/study_cost.h prices both). With GroupBy::kListed a candidate joins only a group of
// runs listed with it (`listed`), one listed in none stays alone.
// Example: [pre-grow/1, post-grow/1, matched/1 (after post-grow/1), pre-grow/2, post-grow/2], order
// seed unset -> {pre-grow/1, post-grow/1}, {matched/1}, {pre-grow/2, post-grow/2}; group 1 refused
// matched/1 ("waits for post-grow/1, a member") and pre-grow/2 ("data.order_seed ...: 1 vs 2").
// By length, the paper's ten runs of one seed -> {pre-joint, post-joint, pre-single-block,
// post-single-block} (6.6e9 tokens), {pre-grow, post-grow, post-joint-longer, pre-freeze,
// post-freeze} (1.97e10), {post-joint-long} (1.31e10).
std::vector<TeacherGroup> group_for_teacher(const std::vector<GroupCandidate>& candidates, size_t max_runs = 0,
                                            GroupBy by = GroupBy::kOrder);

}  // namespace deepen
