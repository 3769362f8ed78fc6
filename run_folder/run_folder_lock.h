// RunFolderLock: one writer per run folder, an exclusive lock held by the writing rank for the job's life.
#pragma once

#include <string>

namespace deepen {

// Two jobs writing one run folder (a double submission, or a requeued job beside a rank of the old
// one that has not ended yet) would interleave its records and checkpoints, and both "succeed". The
// rank that writes a run folder (student 0) takes an exclusive flock(2) on <run dir>/.lock before it
// writes anything, and holds it until the process ends; the file says who holds it (host, pid,
// Slurm job). The kernel releases the lock when the holder dies however it dies (kill -9 included),
// so a dead holder's lock is simply taken over; on NFS the server releases a lost client's locks
// after its lease (about 90 s), and Lustre needs the `flock` mount option (docs/cluster.md). Where
// the file system has no locks at all (flock fails with ENOLCK, EOPNOTSUPP or ENOSYS) the folder is
// written without one, after a warning.
class RunFolderLock {
 public:
  // Takes the lock, waiting up to `wait_s` while another live process holds it (a line on stderr
  // every 10 s names it). Throws InputError naming the folder and the holder when it is still held
  // then, and std::runtime_error when the lock file cannot be opened.
  RunFolderLock(const std::string& run_dir, double wait_s);
  ~RunFolderLock();  // closing the file releases the lock
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;

  // Who holds the lock of `run_dir` as its file says ("host n1, pid 4242, Slurm job 77, since
  // 2026-12-06 13:02:11 UTC"), or "" when nobody wrote one.
  static std::string holder(const std::string& run_dir);

  // Whether another job held the lock when this one asked (it then waited for that job to end):
  // what was read of the folder before the lock may be out of date.
  bool waited() const { return waited_; }

 private:
  int fd_ = -1;
  bool waited_ = false;
};

}  // namespace deepen
