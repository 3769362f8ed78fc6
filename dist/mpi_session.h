// MpiSession: MPI's lifetime as an object owned by main (init with threads, finalize), plus what every
// rank learns at startup: world rank and size, its place on its node, and every rank's hostname.
#pragma once

#include <string>
#include <vector>

namespace deepen {

// Asks for MPI_THREAD_MULTIPLE because the control plane runs an Asio thread beside training.
// Debian's Open MPI 4.1 grants it (ompi_info: "MPI_THREAD_MULTIPLE: yes"); with a library that
// grants less, only the thread that made the session may call MPI, which deepen's training loop
// does anyway: Communicator::abort() sets a flag polled by the blocked thread and never calls MPI.
//
// Construction is collective over MPI_COMM_WORLD (it gathers hostnames, and every rank's build id:
// ranks that run different builds of deepen throw InputError there, naming the builds, their ranks
// and hosts: dist/build_identity.h); so is normal destruction
// (MPI_Finalize). If MPI was already initialized (a test harness), the session neither initializes
// nor finalizes it.
class MpiSession {
 public:
  MpiSession(int* argc = nullptr, char*** argv = nullptr);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Index of this rank among the ranks on its node, and how many share the node (from
  // MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), so it holds under mpirun and srun alike).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // Hostname of every world rank, indexed by rank (for check_placement).
  const std::vector<std::string>& hostnames() const { return hostnames_; }
  // The thread level MPI granted (MPI_THREAD_SINGLE..MPI_THREAD_MULTIPLE) and its name.
  int thread_level() const { return thread_level_; }
  bool thread_multiple() const;
  std::string thread_level_name() const;

  // Call when main leaves with an error: MPI_Finalize is collective in Open MPI and would wait forever
  // for ranks still blocked in communication; without it, mpirun/srun sees the rank exit and ends the
  // job. Also skipped automatically when the session is destroyed during exception unwinding.
  void skip_finalize() { finalize_ = false; }
  // Ends every rank of the job now with `code` (MPI_Abort). For a watchdog that found a dead peer.
  [[noreturn]] void abort_job(int code) const;

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, thread_level_ = 0;
  bool owns_ = false;
  bool finalize_ = true;
  int uncaught_at_start_ = 0;
  std::vector<std::string> hostnames_;
};

}  // namespace deepen
