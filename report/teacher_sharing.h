// Teacher sharing: what the shared-teacher jobs under a study folder saved, from their step_time records.
#pragma once

#include <string>
#include <vector>

namespace deepen {

// One job of runs sharing a teacher (`deepen group`), as its records tell it.
struct SharedTeacherJob {
  std::string dir;         // the job folder (<study>/groups/g<k>/job)
  int64_t passes = 0;      // forward passes of pipeline 0's first stage (rank 0), whole job
  int64_t deliveries = 0;  // micro-batches it delivered to the students of every run
};

// The job folders under `paths` (searched recursively, sorted) that hold step_time/rank0.jsonl with
// teacher records counting deliveries. Throws InputError naming the file on a malformed record.
std::vector<SharedTeacherJob> find_shared_teacher_jobs(const std::vector<std::string>& paths);

// Markdown: one line per job, or "" when there is none.
// Example: passes 38, deliveries 152 -> "- runs/demo/study/groups/g0/job: 38 teacher forward passes
// for 152 micro-batches delivered: 75% of the teacher's work saved (114 passes)".
std::string teacher_sharing_markdown(const std::vector<SharedTeacherJob>& jobs);

}  // namespace deepen
