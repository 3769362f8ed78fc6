// What the students agree on when a step or a write goes wrong: the divergence guard's verdict on a
// step, records that could not be written, weights that are not finite.
//
// Every decision here is collective without a collective of its own: each student takes it from
// the numbers of the step's one all-reduce (agree_on_step), which are the same on every student,
// so all of them skip, stop or go on at the same step, and stop with the same message. A NaN on
// one student reaches the others through that sum, and its own flag names it.
#include <cmath>
#include <filesystem>
#include <iostream>

#include <ATen/ATen.h>

#include "config/input_error.h"
#include "run_folder/guard_events.h"
#include "run_folder/run_folder.h"
#include "train/student_group.h"
#include "train/trainer.h"

namespace deepen {
namespace fs = std::filesystem;

namespace {

// The guard's settings as a hint: what the user can do next (there is no checkpoint to resume from
// when the run stopped before its first one). In a shared teacher's group the lower LR goes into this
// run's entry of the group file: a --set on the command line would reach every run of the group.
std::string guard_hint(bool have_checkpoint, const std::string& group_file, const std::string& run) {
  const std::string lower =
      group_file.empty() ? std::string("--set guard.lr_scale=0.5")
                         : "add \"guard.lr_scale=0.5\" to run " + run + "'s set list in " + group_file +
                               " (not --set, which every run of the group would get)";
  return std::string(have_checkpoint ? "resume from it with a lower LR (" + lower + ")"
                                     : "run again with a lower LR (" + lower + ", or a lower optim.lr)") +
         ", or let the guard skip such steps or roll back by itself (guard.action = \"skip\" | \"rollback\"; "
         "docs/cluster.md)";
}

nlohmann::json guard_event(const char* event, const StepHealth& h, const GuardTrip& trip) {
  return {{"step", h.step},
          {"event", event},
          {"quantity", trip.quantity},
          {"value", std::isfinite(trip.value) ? nlohmann::json(trip.value) : nlohmann::json(guard_number(trip.value))},
          {"loss", guard_number(h.loss)},
          {"grad_norm", guard_number(h.grad_norm)},
          {"students", h.nonfinite_students},
          {"reason", trip.reason}};
}

}  // namespace

Trainer::StepAgreement Trainer::agree_on_step(int64_t step, const double (&sums)[4], double grad_norm) {
  // [loss·n, kl·n, ce·n, n | per student: world rank + 1 where its own loss was not finite |
  //  per student: 1 where a record could not be written]
  const size_t students = static_cast<size_t>(group_.size()), me = static_cast<size_t>(group_.rank());
  std::vector<double> values(4 + 2 * students, 0.0);
  for (size_t i = 0; i < 4; ++i) values[i] = sums[i];
  if (!std::isfinite(sums[0]) || !std::isfinite(sums[1]) || !std::isfinite(sums[2]))
    values[4 + me] = static_cast<double>(run_.world_rank) + 1;
  if (!records_failure_.empty()) values[4 + students + me] = 1;
  const std::vector<double> total = timer_.time(StudentPart::kGradSync, [&] { return group_.sum(values); });
  StepAgreement agreed;
  agreed.loss = total[0] / total[3];
  agreed.kl = total[1] / total[3];
  agreed.ce = total[2] / total[3];
  agreed.health.step = step;
  agreed.health.loss = agreed.loss;
  agreed.health.grad_norm = grad_norm;
  for (size_t s = 0; s < students; ++s) {
    // A NaN flag would itself be NaN after the sum; the flags are finite by construction.
    if (total[4 + s] > 0) {
      agreed.health.nonfinite_students.push_back(static_cast<int64_t>(s));
      agreed.health.nonfinite_world_ranks.push_back(static_cast<int64_t>(total[4 + s]) - 1);
    }
    if (total[4 + students + s] > 0) agreed.records_failed = true;
  }
  return agreed;
}

bool Trainer::guard_allows_update(const StepAgreement& agreed) {
  const StepHealth& h = agreed.health;
  const std::optional<GuardTrip> trip = guard_.check(h);
  if (!trip) return true;
  discard_gradients();
  const std::string head = "guard: step " + std::to_string(h.step) + ": " + trip->reason;
  const GuardConfig& g = cfg_.guard;
  std::string why_stop;  // empty: the configured action runs
  if (g.action == GuardAction::kSkip && skips_ >= g.max_skips)
    why_stop = "guard.max_skips = " + std::to_string(g.max_skips) + " steps were skipped already";
  if (g.action == GuardAction::kRollback && rollbacks_.rollbacks >= g.max_rollbacks)
    why_stop = "guard.max_rollbacks = " + std::to_string(g.max_rollbacks) + " rollbacks happened already";
  if (g.action == GuardAction::kRollback && saved_dir_.empty()) why_stop = "there is no checkpoint to roll back to";

  if (g.action == GuardAction::kSkip && why_stop.empty()) {
    ++skips_;
    if (leader_) {
      // Checked like every record: a failure stops the students at their next agreement.
      write_records([&] { append_guard_event(out_dir_, guard_event("skipped", h, *trip)); });
      if (run_.print_progress)
        std::cerr << "deepen: " << head << "; its update is skipped (" << skips_ << " of guard.max_skips = " << g.max_skips
                  << ")\n";
    }
    return false;
  }
  // A rollback resumes from a checkpoint taken before the update that made this step's weights: one
  // taken right after step h.step - 1 would replay the same loss (a lower LR changes only the updates
  // after it), and the run would roll back until guard.max_rollbacks. Student 0 picks it; all learn it.
  std::string target;
  if (g.action == GuardAction::kRollback && why_stop.empty()) {
    target = gather_texts(leader_ ? rollback_checkpoint(h.step) : "").front();
    if (target.empty())
      why_stop = "no checkpoint was taken before step " + std::to_string(h.step - 1) +
                 "'s update, and resuming after it would repeat this step as it is";
  }
  if (g.action == GuardAction::kRollback && why_stop.empty()) {
    const RollbackState next{rollbacks_.lr_scale * g.rollback_lr_factor, rollbacks_.rollbacks + 1};
    const std::string message =
        head + "; its update was not applied. Rolling back (" + std::to_string(next.rollbacks) +
        " of guard.max_rollbacks = " + std::to_string(g.max_rollbacks) + "): the next start resumes from " + target +
        " and the LR scaled by " + guard_number(next.lr_scale) + " (times guard.lr_scale; recorded in " +
        RunFolder(out_dir_).guard_jsonl() + "); the Slurm scripts requeue on this exit code (5), by hand run the same "
        "command again";
    // Student 0 writes what the next start needs; the others wait for it (a failure is everyone's).
    std::string error;
    if (leader_) {
      try {
        nlohmann::json e = guard_event("rolled_back", h, *trip);
        e["checkpoint"] = target;
        e["lr_scale"] = next.lr_scale;
        e["rollbacks"] = next.rollbacks;
        append_guard_event(out_dir_, e);
        // The checkpoints after it hold the trajectory that diverged; the next start must not take one.
        for (const std::string& dir : store_.list())
          if (dir > target) {
            fs::remove_all(dir);
            std::cerr << "deepen: removed " << dir << ": after the rollback's checkpoint, on the diverged trajectory\n";
          }
      } catch (const std::exception& ex) {
        error = ex.what();
      }
    }
    const std::vector<std::string> errors = gather_texts(error);
    if (!errors.front().empty())
      throw ExitError(kExitFailure, head + "; the rollback could not be recorded: " + errors.front());
    throw ExitError(kExitRollback, message);
  }
  const std::string message = head + "; its update was not applied, and no checkpoint or export holds it" +
                              (why_stop.empty() ? "" : " (guard.action = \"" + std::string(option_name(g.action)) +
                                                           "\" stops: " + why_stop + ")") +
                              ". Last good checkpoint: " + last_good_checkpoint() + "; " + guard_hint(!saved_dir_.empty(), run_.group_file, cfg_.run.name);
  if (leader_)
    write_records([&] {
      nlohmann::json e = guard_event("stopped", h, *trip);
      e["lr_scale"] = lr_scale_;  // a run resumed with the same LR would diverge the same way
      append_guard_event(out_dir_, e);
    });
  throw ExitError(kExitDiverged, message);
}

std::string Trainer::rollback_checkpoint(int64_t step) const {
  const std::vector<std::string> dirs = store_.list();
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    const std::string name = fs::path(*it).filename().string();
    const int64_t after = std::stoll(name.substr(name.find('_') + 1));  // the state after step `after`
    if (after <= step - 2 && !CheckpointStore::verify(*it)) return *it;
  }
  return "";
}

std::string Trainer::last_good_checkpoint() const {
  if (saved_dir_.empty()) return "none (the run stopped before its first checkpoint)";
  return saved_dir_ + " (after step " + std::to_string(saved_ - 1) + ")";
}

void Trainer::write_records(const std::function<void()>& write) {
  if (!records_failure_.empty()) return;  // a gap in a record file is never written past
  try {
    write();
  } catch (const std::exception& e) {
    records_failure_ = e.what();
    // Said now: once the students stop, the launcher may end this rank before it throws.
    std::cerr << "deepen: student " << group_.rank() << ": " << records_failure_ << std::endl;
  }
}

void Trainer::check_records_written() {
  const std::vector<double> failed = group_.sum({records_failure_.empty() ? 0.0 : 1.0});
  if (failed[0] > 0) stop_for_records();
}

void Trainer::stop_for_records() {
  std::string message = "records could not be written: ";
  const std::vector<std::string> failures = gather_texts(records_failure_);
  bool first = true;
  for (size_t s = 0; s < failures.size(); ++s) {
    if (failures[s].empty()) continue;
    message += (first ? "" : "; ") + std::string("student ") + std::to_string(s) + ": " + failures[s];
    first = false;
  }
  // The state before this step: what the records that were written describe.
  if (progress_.steps_done > saved_) {
    try {
      checkpoint();
      message += ". Checkpoint " + saved_dir_ + " holds the state after step " + std::to_string(saved_ - 1) +
                 ": free space (or fix the file system) and run the same command to resume";
    } catch (const std::exception& e) {
      message += ". The checkpoint after step " + std::to_string(progress_.steps_done - 1) +
                 " could not be written either (" + e.what() + "); the last good one is " + last_good_checkpoint();
    }
  } else {
    message += ". The last good checkpoint is " + last_good_checkpoint();
  }
  throw ExitError(kExitFailure, message);
}

void Trainer::check_finite_parameters(const char* what) {
  for (const auto& item : student_->named_parameters()) {
    if (at::isfinite(item.value()).all().template item<bool>()) continue;
    const int64_t step = progress_.steps_done - 1;
    const std::string reason = "parameter " + item.key() + " is not finite";
    if (leader_)  // the run's record says it diverged (a study or group does not rerun it as it is)
      write_records([&] {
        append_guard_event(out_dir_, {{"step", step}, {"event", "stopped"}, {"quantity", "parameter"},
                                      {"reason", reason}, {"lr_scale", lr_scale_}});
      });
    throw ExitError(kExitDiverged, "guard: after step " + std::to_string(step) + ": " + reason + "; " + what +
                                       " is not written from it. Last good checkpoint: " + last_good_checkpoint() +
                                       "; " + guard_hint(!saved_dir_.empty(), run_.group_file, cfg_.run.name));
  }
}

std::vector<std::string> Trainer::gather_texts(const std::string& mine) {
  // Through the students' sum of doubles: lengths first, then every byte in its student's range
  // (each byte is exact in a double). Only error paths call it, so its cost does not matter.
  const size_t students = static_cast<size_t>(group_.size()), me = static_cast<size_t>(group_.rank());
  std::vector<double> lengths(students, 0.0);
  lengths[me] = static_cast<double>(mine.size());
  lengths = group_.sum(lengths);
  std::vector<size_t> offset(students + 1, 0);
  for (size_t s = 0; s < students; ++s) offset[s + 1] = offset[s] + static_cast<size_t>(lengths[s]);
  std::vector<double> bytes(std::max<size_t>(offset.back(), 1), 0.0);
  for (size_t i = 0; i < mine.size(); ++i) bytes[offset[me] + i] = static_cast<unsigned char>(mine[i]);
  bytes = group_.sum(bytes);
  std::vector<std::string> out(students);
  for (size_t s = 0; s < students; ++s)
    for (size_t i = offset[s]; i < offset[s + 1]; ++i) out[s].push_back(static_cast<char>(static_cast<int>(bytes[i])));
  return out;
}

}  // namespace deepen
