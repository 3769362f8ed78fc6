// Rank layout: which rank is which teacher stage or student, the groups each one joins, the layers
// of each teacher stage, and the placement checks (nodes, GPUs, backend) made before any heavy work.
#pragma once

#include <string>
#include <vector>

#include "config/options.h"

namespace deepen {

struct ParallelConfig;

enum class RankRole { kTeacher, kStudent };

// What one rank does.
struct RankInfo {
  RankRole role = RankRole::kStudent;
  int pipeline = -1;  // teacher: its pipeline t; student: the pipeline whose logits it trains on
  int stage = -1;     // teacher: 0..P-1; student: -1
  int student = -1;   // student: its data-parallel index s in 0..S-1; teacher: -1
  int run = -1;       // student: the run it trains (0..R-1; one run unless a teacher is shared); teacher: -1
  int first_layer = 0;  // teacher: this stage holds decoder layers [first_layer, last_layer),
  int last_layer = 0;   //   split by model/layer_split.h's split_layers_with_head; student: 0, 0
  bool is_teacher() const { return role == RankRole::kTeacher; }
  bool is_student() const { return role == RankRole::kStudent; }
};

// The communicator groups of the design: each teacher pipeline (activations), each logit channel
// (last stage of pipeline t + the students it serves, in every run), and each run's students
// (gradients, growth).
enum class GroupKind { kTeacherPipeline, kLogitChannel, kStudents };

// A rank's place in one kind of group, in the form Communicator::split(color, key) takes: ranks with
// the same color form one group, ordered by key (so key = rank in the group). color < 0: not a member.
struct GroupSlot {
  int color = -1;
  int key = -1;
  bool member() const { return color >= 0; }
  bool operator==(const GroupSlot&) const = default;
};

// The order of world ranks (parallel.rank_order). Slurm's block distribution fills each node with
// consecutive ranks, so the order decides which ranks share a node and which links cross nodes.
//   kRoles:     teacher ranks first, pipeline by pipeline, then the students; with tasks per node
//               dividing T·P, teachers and students fall on separate nodes by rank ranges.
//   kPipelines: pipeline by pipeline, its P stages then the S/T students it feeds; with tasks per
//               node a multiple of P + S/T, each pipeline shares a node with its students, so the
//               logit channel stays inside the node and only the students' gradient all-reduce (and
//               growth agreement) crosses nodes.
// (RankOrder, parallel.rank_order: config/options.h)

// Pipeline t serves the students [t·S/T, (t+1)·S/T) in either order; student indices, stages and
// every group's key order are the same in both, only the world ranks behind them move.
//
// kRoles examples.
// Example: T=2 pipelines, P=2 stages, S=4 students, world=8, a 36-layer teacher
//   ranks 0,1 = pipeline 0 stages 0,1 (layers [0,18), [18,36))
//   ranks 2,3 = pipeline 1 stages 0,1 (layers [0,18), [18,36))
//   ranks 4,5 = students 0,1 (fed by pipeline 0)   ranks 6,7 = students 2,3 (fed by pipeline 1)
//   groups: pipeline 0 = {0,1}          pipeline 1 = {2,3}
//           logit channel 0 = {1,4,5}   logit channel 1 = {3,6,7}  (the last stage has key 0)
//           students = {4,5,6,7}
// Example: T=1, P=3, S=2, world=5: ranks 0,1,2 = stages 0,1,2; ranks 3,4 = students 0,1;
//   pipeline 0 = {0,1,2}, logit channel 0 = {2,3,4}, students = {3,4}.
// Example: T=2, P=1, S=2, world=4: ranks 0,1 = pipelines 0,1 (one stage each, all layers);
//   ranks 2,3 = students 0,1; logit channel 0 = {0,2}, logit channel 1 = {1,3}, students = {2,3}.
//
// kPipelines examples (group of a pipeline = P + S/T consecutive ranks).
// Example: T=2, P=2, S=4, world=8
//   ranks 0,1 = pipeline 0 stages 0,1   ranks 2,3 = students 0,1 (fed by pipeline 0)
//   ranks 4,5 = pipeline 1 stages 0,1   ranks 6,7 = students 2,3 (fed by pipeline 1)
//   groups: pipeline 0 = {0,1}          pipeline 1 = {4,5}
//           logit channel 0 = {1,2,3}   logit channel 1 = {5,6,7}
//           students = {2,3,6,7}        (student s keeps key s, wherever its rank is)
// Example: T=2, P=4, S=8 on 2 nodes of 8 tasks (a 36-layer teacher)
//   kRoles:     node 0 = ranks 0..7 = both pipelines' stages, node 1 = ranks 8..15 = students 0..7:
//               every logit crosses nodes, the students' all-reduce stays on node 1.
//   kPipelines: node 0 = ranks 0..3 pipeline 0 stages 0..3, ranks 4..7 students 0..3;
//               node 1 = ranks 8..11 pipeline 1 stages 0..3, ranks 12..15 students 4..7:
//               logit channel 0 = {3,4,5,6,7} and 1 = {11,12,13,14,15} stay on their node, the
//               students' all-reduce {4..7,12..15} crosses nodes.
// Example: T=8, P=1, S=8 on 2 nodes of 8 (the paper config's layout), kPipelines: rank 2t = pipeline
//   t, rank 2t+1 = student t; node 0 holds pipelines 0..3 and students 0..3, node 1 the rest.
// Example: T=1: both orders are the same (stages 0..P-1, then the students).
//
// A shared teacher (R runs of S students each, world = T·P + R·S): the runs' students follow one
// another, run 0's first, wherever one run's students would sit; a logit channel holds its last stage
// and the S/T students it serves in every run (run-major); each run's students form their own group.
// Example: T=1, P=2, S=1, R=4, world=6 (kRoles): ranks 0,1 = stages 0,1; rank 2+r = run r's student 0;
//   logit channel 0 = {1,2,3,4,5}; students of run r = {2+r}.
// Example: T=2, P=1, S=2, R=2, world=6, kRoles: ranks 0,1 = pipelines 0,1; ranks 2,3 = run 0's
//   students 0,1; ranks 4,5 = run 1's students 0,1; logit channel 0 = {0,2,4}, 1 = {1,3,5};
//   students: run 0 = {2,3}, run 1 = {4,5}. kPipelines: rank 0 = pipeline 0, ranks 1,2 = its
//   students (run 0's s0, run 1's s0), rank 3 = pipeline 1, ranks 4,5 = run 0's s1, run 1's s1.
struct RankLayout {
  int teacher_pipelines = 0;  // T
  int teacher_stages = 0;     // P
  int students = 0;           // S, per run
  int runs = 1;               // R: runs sharing the teacher
  int world_size = 0;         // T·P + R·S
  int teacher_layers = 0;
  RankOrder order = RankOrder::kRoles;
  std::vector<RankInfo> ranks;  // indexed by world rank

  int teacher_ranks() const { return teacher_pipelines * teacher_stages; }
  int students_per_pipeline() const { return teacher_pipelines > 0 ? students / teacher_pipelines : students; }
  // World rank of pipeline t's stage p, and of run r's student s.
  int teacher_rank(int pipeline, int stage) const;
  int student_rank(int student, int run = 0) const;
  // A logit channel's rank of run r's student s (the last stage is channel rank 0).
  int channel_rank(int student, int run = 0) const { return 1 + run * students_per_pipeline() + student % students_per_pipeline(); }
  // Members of group `index` of a kind (pipeline or channel t; run r for kStudents), in key order.
  std::vector<int> group_ranks(GroupKind kind, int index = 0) const;
  // How many groups of a kind there are (T, T, R).
  int group_count(GroupKind kind) const;
  // Where world rank `rank` sits in groups of `kind` (color = group index, key = rank in group).
  GroupSlot slot(int rank, GroupKind kind) const;
  // A readable table of roles and groups, for --dry-run and the run's log.
  std::string describe() const;
};

// Pure: the layout for a config (counts and parallel.rank_order), a world size and the teacher's
// decoder layer count. head_layers:
// the last stage's LM head in layers' worth (split_layers_with_head; 0 = the plain balanced split,
// as with distill.logits = "hidden", where the students run the head).
// Throws InputError naming parallel.* keys when the world size is not T·P+S, when S is not a multiple
// of T, when P exceeds the teacher's layers, or when a count is below 1.
// `runs` > 1: R runs of S students share the teacher (world = T·P + R·S).
RankLayout make_rank_layout(const ParallelConfig& cfg, int world_size, int teacher_layers, double head_layers = 0,
                            int runs = 1);

// A job with no teacher ranks (distill.source = "cache": the students read a teacher cache): world =
// parallel.students, rank s = student s, one students group; no pipeline, no logit channel (T = P = 0).
// parallel.teacher_pipelines and teacher_stages are not used. InputError naming parallel.students
// when the world size differs. Example: S = 4, world 4: ranks 0..3 = students 0..3, students = {0,1,2,3}.
RankLayout make_student_layout(const ParallelConfig& cfg, int world_size);

// Node-aware placement, from the hostname of every world rank (gathered at startup). Returns
// warnings for the caller to log; on one node there is nothing to check.
//   kRoles, more than one node: a node that hosts both teachers and students is an InputError: rank
//     ranges are meant to put them on separate nodes, and a mixed node means the allocation's tasks
//     per node do not divide T·P (the message says so, and names rank_order = "pipelines").
//   kPipelines, more than one node: a node holding a pipeline's stages and its students is the
//     intended layout; students not on their pipeline's last-stage node are a warning naming them
//     (their logits cross the network: the tasks per node are not a multiple of P + S/T).
//   Either order: a teacher pipeline whose stages span nodes is a warning (its activations cross the
//     network).
// Example (kPipelines, T=2, P=1, S=4, ranks t0 s0 s1 t1 s2 s3): hosts a a a b b b -> no warning;
//   hosts a a b b c c -> logit channel 0: students {2} on b, last stage rank 0 on a; channel 1:
//   students {4,5} on c, last stage rank 3 on b.
std::vector<std::string> check_placement(const RankLayout& layout,
                                          const std::vector<std::string>& hostnames);

// The CUDA device of a rank from its node-local rank (node_local_rank in dist/run_device.h):
// local_rank mod device_count, among the devices this process sees. One rule serves the ways sites
// hand out GPUs (8-GPU nodes, 8 ranks each):
//   every task sees all 8 GPUs          -> local ranks 0..7 -> devices 0..7
//   each task sees its own GPU (srun --gpus-per-task=1, CUDA_VISIBLE_DEVICES per task)
//                                        -> device 0 in every task, 8 different physical GPUs
//   each task sees the 4 GPUs of its socket (local ranks 0..3 see GPUs 0..3, 4..7 see 4..7)
//                                        -> local rank 5 -> device 1 = physical GPU 5
// Whether two ranks really share a GPU (8 ranks that all see the same 4) only the physical ids can
// tell: check_distinct_devices decides, naming both ranks. InputError when no device is visible.
int choose_cuda_device(int local_rank, int device_count);

// Throws InputError naming the two world ranks when two entries are equal; an entry identifies a
// physical GPU, e.g. "<hostname>/<PCI bus id>".
void check_distinct_devices(const std::vector<std::string>& device_ids);

}  // namespace deepen
