// Rank layout, layer split and placement checks: pure functions over the config and the world.
#include "dist/rank_layout.h"

#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "config/config.h"
#include "config/input_error.h"
#include "model/layer_split.h"

namespace deepen {
namespace {

std::string join(const std::vector<int>& xs) {
  std::string s = "{";
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(xs[i]);
  }
  return s + "}";
}

std::string join(const std::set<std::string>& xs) {
  std::string s;
  for (const auto& x : xs) {
    if (!s.empty()) s += ", ";
    s += x;
  }
  return s;
}

}  // namespace

RankLayout make_rank_layout(const ParallelConfig& cfg, int world_size, int teacher_layers, double head_layers,
                            int runs) {
  const int64_t T = cfg.teacher_pipelines, P = cfg.teacher_stages, S = cfg.students;
  if (T < 1) throw InputError("parallel.teacher_pipelines: must be at least 1, got " + std::to_string(T));
  if (P < 1) throw InputError("parallel.teacher_stages: must be at least 1, got " + std::to_string(P));
  if (S < 1) throw InputError("parallel.students: must be at least 1, got " + std::to_string(S));
  if (S % T != 0)
    throw InputError("parallel.students = " + std::to_string(S) +
                     " is not a multiple of parallel.teacher_pipelines = " + std::to_string(T) +
                     ": every pipeline must serve the same number of students");
  if (runs < 1) throw std::invalid_argument("make_rank_layout: " + std::to_string(runs) + " runs");
  const int64_t R = runs;
  if (T * P + R * S != world_size)
    throw InputError("world size " + std::to_string(world_size) +
                     " does not match parallel.teacher_pipelines (" + std::to_string(T) +
                     ") x parallel.teacher_stages (" + std::to_string(P) + ") + " +
                     (R > 1 ? std::to_string(R) + " runs x " : std::string()) + "parallel.students (" +
                     std::to_string(S) + ") = " + std::to_string(T * P + R * S) +
                     ": launch that many ranks or change parallel.*");
  const RankOrder order = cfg.rank_order;
  const std::vector<std::pair<int, int>> split = split_layers_with_head(teacher_layers, static_cast<int>(P), head_layers);

  RankLayout l;
  l.teacher_pipelines = static_cast<int>(T);
  l.teacher_stages = static_cast<int>(P);
  l.students = static_cast<int>(S);
  l.runs = runs;
  l.world_size = world_size;
  l.teacher_layers = teacher_layers;
  l.order = order;
  l.ranks.resize(world_size);
  for (int t = 0; t < T; ++t) {
    for (int p = 0; p < P; ++p) {
      RankInfo& r = l.ranks[l.teacher_rank(t, p)];
      r.role = RankRole::kTeacher;
      r.pipeline = t;
      r.stage = p;
      r.first_layer = split[p].first;
      r.last_layer = split[p].second;
    }
  }
  for (int run = 0; run < runs; ++run) {
    for (int s = 0; s < S; ++s) {
      RankInfo& r = l.ranks[l.student_rank(s, run)];
      r.role = RankRole::kStudent;
      r.student = s;
      r.run = run;
      r.pipeline = s / l.students_per_pipeline();
    }
  }
  return l;
}

RankLayout make_student_layout(const ParallelConfig& cfg, int world_size) {
  if (cfg.students < 1) throw InputError("parallel.students: must be at least 1, got " + std::to_string(cfg.students));
  if (cfg.students != world_size)
    throw InputError("world size " + std::to_string(world_size) + " does not match parallel.students (" +
                     std::to_string(cfg.students) + "): a run from a teacher cache has no teacher ranks; launch " +
                     std::to_string(cfg.students) + " ranks or change parallel.students");
  RankLayout l;
  l.students = static_cast<int>(cfg.students);
  l.world_size = world_size;
  l.order = RankOrder::kRoles;
  l.ranks.resize(world_size);
  for (int s = 0; s < world_size; ++s) {
    RankInfo& r = l.ranks[s];
    r.role = RankRole::kStudent;
    r.student = s;
    r.run = 0;
  }
  return l;
}

int RankLayout::teacher_rank(int pipeline, int stage) const {
  if (pipeline < 0 || pipeline >= teacher_pipelines || stage < 0 || stage >= teacher_stages)
    throw std::out_of_range("RankLayout::teacher_rank: no pipeline " + std::to_string(pipeline) +
                            " stage " + std::to_string(stage));
  if (order == RankOrder::kPipelines) return pipeline * (teacher_stages + runs * students_per_pipeline()) + stage;
  return pipeline * teacher_stages + stage;
}

int RankLayout::student_rank(int student, int run) const {
  if (student < 0 || student >= students || run < 0 || run >= runs)
    throw std::out_of_range("RankLayout::student_rank: no student " + std::to_string(student) + " of run " +
                            std::to_string(run));
  if (order == RankOrder::kPipelines) {
    const int k = students_per_pipeline();
    return (student / k) * (teacher_stages + runs * k) + teacher_stages + run * k + student % k;
  }
  return teacher_ranks() + run * students + student;
}

int RankLayout::group_count(GroupKind kind) const {
  return kind == GroupKind::kStudents ? runs : teacher_pipelines;
}

std::vector<int> RankLayout::group_ranks(GroupKind kind, int index) const {
  if (index < 0 || index >= group_count(kind))
    throw std::out_of_range("RankLayout::group_ranks: no group " + std::to_string(index));
  std::vector<int> out;
  switch (kind) {
    case GroupKind::kTeacherPipeline:
      for (int p = 0; p < teacher_stages; ++p) out.push_back(teacher_rank(index, p));
      break;
    case GroupKind::kLogitChannel: {
      out.push_back(teacher_rank(index, teacher_stages - 1));
      const int k = students_per_pipeline();
      for (int run = 0; run < runs; ++run)
        for (int s = index * k; s < (index + 1) * k; ++s) out.push_back(student_rank(s, run));
      break;
    }
    case GroupKind::kStudents:
      for (int s = 0; s < students; ++s) out.push_back(student_rank(s, index));
      break;
  }
  return out;
}

GroupSlot RankLayout::slot(int rank, GroupKind kind) const {
  const RankInfo& r = ranks.at(rank);
  switch (kind) {
    case GroupKind::kTeacherPipeline:
      if (r.is_teacher()) return {r.pipeline, r.stage};
      return {};
    case GroupKind::kLogitChannel:
      if (r.is_teacher()) return r.stage == teacher_stages - 1 ? GroupSlot{r.pipeline, 0} : GroupSlot{};
      if (teacher_pipelines == 0) return {};  // students of a teacher cache: no channel
      return {r.pipeline, channel_rank(r.student, r.run)};
    case GroupKind::kStudents:
      if (r.is_student()) return {r.run, r.student};
      return {};
  }
  return {};
}

std::string RankLayout::describe() const {
  std::ostringstream o;
  o << "world " << world_size << " = " << teacher_pipelines << " teacher pipeline(s) x "
    << teacher_stages << " stage(s) + " << (runs > 1 ? std::to_string(runs) + " runs x " : std::string())
    << students << " student(s); teacher has " << teacher_layers
    << " layers; rank order \"" << option_name(order) << "\"\n";
  for (int i = 0; i < world_size; ++i) {
    const RankInfo& r = ranks[i];
    o << "  rank " << i << ": ";
    if (r.is_teacher())
      o << "teacher pipeline " << r.pipeline << " stage " << r.stage << ", layers [" << r.first_layer
        << ", " << r.last_layer << ")";
    else
      o << (runs > 1 ? "run " + std::to_string(r.run) + " " : std::string()) << "student " << r.student
        << (teacher_pipelines > 0 ? ", fed by pipeline " + std::to_string(r.pipeline) : ", targets from the teacher cache");
    o << "\n";
  }
  for (int t = 0; t < teacher_pipelines; ++t)
    o << "  pipeline " << t << " = " << join(group_ranks(GroupKind::kTeacherPipeline, t))
      << ", logit channel " << t << " = " << join(group_ranks(GroupKind::kLogitChannel, t)) << "\n";
  for (int run = 0; run < runs; ++run)
    o << "  students" << (runs > 1 ? " of run " + std::to_string(run) : std::string()) << " = "
      << join(group_ranks(GroupKind::kStudents, run)) << "\n";
  return o.str();
}

std::vector<std::string> check_placement(const RankLayout& layout,
                                          const std::vector<std::string>& hostnames) {
  if (static_cast<int>(hostnames.size()) != layout.world_size)
    throw std::invalid_argument("check_placement: " + std::to_string(hostnames.size()) +
                                " hostnames for a world of " + std::to_string(layout.world_size));
  const std::set<std::string> nodes(hostnames.begin(), hostnames.end());
  std::vector<std::string> warnings;
  if (nodes.size() <= 1) return warnings;

  if (layout.order == RankOrder::kRoles) {
    std::map<std::string, std::pair<std::vector<int>, std::vector<int>>> roles;  // node -> teachers, students
    for (int i = 0; i < layout.world_size; ++i) {
      auto& [teachers, students] = roles[hostnames[i]];
      (layout.ranks[i].is_teacher() ? teachers : students).push_back(i);
    }
    for (const auto& [node, ts] : roles) {
      if (!ts.first.empty() && !ts.second.empty())
        throw InputError("placement: node " + node + " hosts teacher ranks " + join(ts.first) +
                         " and student ranks " + join(ts.second) + " in a job on " +
                         std::to_string(nodes.size()) + " nodes; with parallel.rank_order = \"roles\" teachers (the first " +
                         std::to_string(layout.teacher_ranks()) +
                         " ranks = parallel.teacher_pipelines x parallel.teacher_stages) and students "
                         "must be on separate nodes: make the tasks per node divide " +
                         std::to_string(layout.teacher_ranks()) +
                         ", or set parallel.rank_order = \"pipelines\" to put each pipeline beside its students "
                         "(tasks per node a multiple of parallel.teacher_stages + students per pipeline = " +
                         std::to_string(layout.teacher_stages + layout.runs * layout.students_per_pipeline()) + "), or change parallel.*");
    }
  }
  for (int t = 0; t < layout.teacher_pipelines; ++t) {
    std::set<std::string> spanned;
    for (int r : layout.group_ranks(GroupKind::kTeacherPipeline, t)) spanned.insert(hostnames[r]);
    if (spanned.size() > 1)
      warnings.push_back("placement: teacher pipeline " + std::to_string(t) + " spans nodes " +
                         join(spanned) + ": its activations cross the network between stages");
  }
  if (layout.order == RankOrder::kPipelines) {
    // The point of this order: a channel's students on its last stage's node.
    for (int t = 0; t < layout.teacher_pipelines; ++t) {
      const std::vector<int> channel = layout.group_ranks(GroupKind::kLogitChannel, t);
      const std::string& home = hostnames[channel.front()];
      std::vector<int> away;
      std::set<std::string> away_nodes;
      for (size_t i = 1; i < channel.size(); ++i) {
        if (hostnames[channel[i]] == home) continue;
        away.push_back(channel[i]);
        away_nodes.insert(hostnames[channel[i]]);
      }
      if (!away.empty())
        warnings.push_back("placement: logit channel " + std::to_string(t) + ": student ranks " + join(away) +
                           " are on " + join(away_nodes) + ", not on " + home + " with pipeline " + std::to_string(t) +
                           "'s last stage (rank " + std::to_string(channel.front()) +
                           "): their logits cross the network; with parallel.rank_order = \"pipelines\" make the tasks "
                           "per node a multiple of parallel.teacher_stages + students per pipeline = " +
                           std::to_string(layout.teacher_stages + layout.runs * layout.students_per_pipeline()));
    }
  }
  return warnings;
}

int choose_cuda_device(int local_rank, int device_count) {
  if (device_count < 1) throw InputError("placement: no CUDA device visible to this rank");
  if (local_rank < 0) throw std::invalid_argument("choose_cuda_device: negative local rank " + std::to_string(local_rank));
  return local_rank % device_count;
}

void check_distinct_devices(const std::vector<std::string>& device_ids) {
  std::map<std::string, int> first;
  for (int i = 0; i < static_cast<int>(device_ids.size()); ++i) {
    auto [it, fresh] = first.emplace(device_ids[i], i);
    if (!fresh)
      throw InputError("placement: ranks " + std::to_string(it->second) + " and " + std::to_string(i) +
                       " use the same GPU " + device_ids[i] +
                       ", which NCCL forbids (each rank takes visible device local_rank mod the devices it sees, "
                       "so ranks of one node that all see the same GPUs share one when there are more ranks than "
                       "GPUs); launch at most one rank per GPU");
  }
}

}  // namespace deepen
