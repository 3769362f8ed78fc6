// Which runs may share a teacher pass (see teacher_groups.h).
#include "study/teacher_groups.h"

#include <algorithm>
#include <iomanip>
#include <sstream>
#include <utility>

#include "config/count.h"

namespace deepen {
namespace {

struct Entry {
  std::string key, value;
};

template <class T> std::string text(const T& v) {
  std::ostringstream o;
  o << std::setprecision(17) << v;
  return o.str();
}

std::string text(const std::string& v) { return "\"" + v + "\""; }

// The settings a shared teacher pass needs equal, in the order teacher_groups.h lists them.
std::vector<Entry> share_entries(const Config& c) {
  const DataConfig& d = c.data;
  const ParallelConfig& p = c.parallel;
  std::vector<Entry> e = {
      {"teacher.checkpoint", text(c.teacher.checkpoint)},
      {"teacher.dtype", text(c.teacher.dtype)},
      {"teacher.cpu_kernels", text(c.teacher.cpu_kernels)},
      {"parallel.activation_dtype", text(p.activation_dtype)},
      {"distill.logits", text(c.distill.logits)},
      {"distill.channel_dtype", text(c.distill.channel_dtype)},
      // The teacher sends [rows, V] (or hidden states for the students' copy of its head): every
      // run's vocabulary must be that V. 0 is the tokenizer's padded size, the same for one tokenizer.
      {"student.vocab_size", text(c.student.vocab_size)},
  };
  if (c.distill.logits == TeacherOutput::kTopk) {
    e.push_back({"distill.topk", text(c.distill.topk)});
    e.push_back({"distill.tail", text(c.distill.tail)});
    e.push_back({"distill.temperature", text(c.distill.temperature)});
    e.push_back({"distill.vocab_chunk", text(c.distill.vocab_chunk)});
  }
  e.push_back({"data.tokenizer", text(d.tokenizer)});
  e.push_back({"data.train", text(d.train)});
  e.push_back({"data.valid", text(d.valid)});
  e.push_back({"data.packing", text(d.packing)});
  if (d.packing == Packing::kDocuments) {
    e.push_back({"data.max_len", text(d.max_len)});
    e.push_back({"data.valid_documents", text(d.valid_documents)});
  } else {
    e.push_back({"data.seq_len", text(d.seq_len)});
  }
  e.push_back({"parallel.micro_batch", text(p.micro_batch)});
  e.push_back({"global batch (parallel.students x micro_batch x grad_accum)", text(p.students * p.micro_batch * p.grad_accum)});
  if (!(d.packing == Packing::kDocuments && d.valid_documents > 0)) e.push_back({"eval.batches", text(c.eval.batches)});
  e.push_back({"data.order_seed (run.seed when unset)", text(data_order_seed(c))});
  e.push_back({"parallel.teacher_pipelines", text(p.teacher_pipelines)});
  e.push_back({"parallel.teacher_stages", text(p.teacher_stages)});
  e.push_back({"parallel.students", text(p.students)});
  e.push_back({"parallel.rank_order", text(p.rank_order)});
  e.push_back({"parallel.backend", text(p.backend)});
  e.push_back({"parallel.max_in_flight", text(p.max_in_flight)});
  e.push_back({"run.device", text(c.run.device)});
  const ControlConfig& ct = c.control;
  e.push_back({"[control]", text(ct.heartbeat_s) + " " + text(ct.watchdog_s) + " " + text(ct.metrics_port) + " " +
                                 ct.metrics_bind + " " + text(ct.coordinator_port) + " " + text(ct.nccl_setup_timeout_s)});
  return e;
}

}  // namespace

std::optional<std::string> teacher_share_difference(const Config& a, const Config& b) {
  const std::vector<Entry> ea = share_entries(a), eb = share_entries(b);
  for (size_t i = 0; i < std::min(ea.size(), eb.size()); ++i) {
    if (ea[i].key != eb[i].key) return ea[i].key + " / " + eb[i].key + ": set in one run only";
    if (ea[i].value != eb[i].value) return ea[i].key + ": " + ea[i].value + " vs " + eb[i].value;
  }
  if (ea.size() != eb.size()) return std::string("distill/data settings: set in one run only");
  return std::nullopt;
}

double curriculum_tokens(const Config& cfg) {
  const CurriculumConfig& c = cfg.curriculum;
  double tokens = 0;
  if (!c.stage_tokens.empty()) {
    for (const std::string& t : c.stage_tokens) tokens += static_cast<double>(parse_count(t));
    return tokens;
  }
  const ParallelConfig& p = cfg.parallel;
  const double sequences = p.global_batch > 0 ? static_cast<double>(p.global_batch)
                                              : static_cast<double>(p.students * p.micro_batch * p.grad_accum);
  const double length = static_cast<double>(cfg.data.packing == Packing::kDocuments ? cfg.data.max_len : cfg.data.seq_len);
  for (int64_t steps : c.stage_steps) tokens += static_cast<double>(steps) * sequences * length;
  return tokens;
}

std::vector<TeacherGroup> group_for_teacher(const std::vector<GroupCandidate>& candidates, size_t max_runs,
                                            GroupBy by) {
  std::vector<TeacherGroup> groups;
  std::vector<size_t> group_of(candidates.size(), 0);
  for (size_t i = 0; i < candidates.size(); ++i) {
    const GroupCandidate& c = candidates[i];
    // It must run after every group that holds a run it waits for.
    size_t earliest = 0;
    for (size_t dep : c.depends_on) earliest = std::max(earliest, group_of.at(dep) + 1);
    bool placed = false;
    for (size_t g = 0; g < groups.size() && !placed; ++g) {
      TeacherGroup& group = groups[g];
      std::string refusal;
      if (g < earliest) {
        // g runs before (or is) the group of a run this one waits for.
        for (size_t dep : c.depends_on)
          if (group_of[dep] >= g && refusal.empty())
            refusal = "waits for " + candidates[dep].name + (group_of[dep] == g ? ", a member" : ", a later group's");
      } else if (max_runs > 0 && group.members.size() >= max_runs) {
        refusal = "the group is full (" + std::to_string(max_runs) + " runs)";
      } else if (by == GroupBy::kListed &&
                 (c.listed.empty() || c.listed != candidates[group.members.front()].listed)) {
        refusal = c.listed.empty() ? std::string("listed in no [[group]] of the study")
                                   : "listed in another [[group]] (" + c.listed + ")";
      } else if (by == GroupBy::kLength && curriculum_tokens(candidates[group.members.front()].config) !=
                                               curriculum_tokens(c.config)) {
        refusal = "another length (" + text(curriculum_tokens(c.config)) + " tokens vs " +
                  text(curriculum_tokens(candidates[group.members.front()].config)) + "; study.group_by = \"length\")";
      } else {
        for (size_t m : group.members)
          if (auto why = teacher_share_difference(candidates[m].config, c.config)) {
            refusal = *why + " (" + candidates[m].name + " vs this run)";
            break;
          }
      }
      if (refusal.empty()) {
        group.members.push_back(i);
        group_of[i] = g;
        placed = true;
      } else {
        group.refused.push_back(c.name + ": " + refusal);
      }
    }
    if (!placed) {
      groups.push_back(TeacherGroup{{i}, {}});
      group_of[i] = groups.size() - 1;
    }
  }
  return groups;
}

}  // namespace deepen
