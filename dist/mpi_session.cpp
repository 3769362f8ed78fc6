// MpiSession: MPI_Init_thread / MPI_Finalize, node-local rank, hostnames of all ranks.
#include "dist/mpi_session.h"

#include <mpi.h>

#include <cstring>
#include <exception>
#include <stdexcept>

#include "dist/build_identity.h"

namespace deepen {
namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string("MPI: ") + what + ": " + std::string(msg, len));
}

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) : uncaught_at_start_(std::uncaught_exceptions()) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Query_thread(&thread_level_);
  } else {
    check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &thread_level_), "MPI_Init_thread");
    owns_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);

  MPI_Comm node = MPI_COMM_NULL;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
        "MPI_Comm_split_type");
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_size(node, &local_size_);
  MPI_Comm_free(&node);

  // The ranks' first exchange: each one's host name and, after its NUL in the same fixed-size record,
  // its build id. One record of the size it always had, so a deepen too old to send an id still takes
  // part (its id reads as ""), and a stale binary is refused here, before any rank does work.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  const std::string build = this_build_id();
  if (size_t(len) + 2 + build.size() <= MPI_MAX_PROCESSOR_NAME)
    std::memcpy(name + len + 1, build.data(), build.size());
  std::vector<char> all(static_cast<size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
  check(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                      MPI_COMM_WORLD),
        "MPI_Allgather(hostnames)");
  std::vector<std::string> builds;
  for (int r = 0; r < size_; ++r) {
    const char* record = all.data() + size_t(r) * MPI_MAX_PROCESSOR_NAME;
    hostnames_.emplace_back(record);
    const size_t host_len = hostnames_.back().size();
    builds.emplace_back(host_len + 1 < MPI_MAX_PROCESSOR_NAME ? record + host_len + 1 : "");
  }
  check_same_build(hostnames_, builds);
}

MpiSession::~MpiSession() {
  if (!owns_ || !finalize_ || std::uncaught_exceptions() > uncaught_at_start_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

bool MpiSession::thread_multiple() const { return thread_level_ == MPI_THREAD_MULTIPLE; }

std::string MpiSession::thread_level_name() const {
  switch (thread_level_) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

void MpiSession::abort_job(int code) const {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::terminate();  // MPI_Abort does not return; keep [[noreturn]] honest if it does
}

}  // namespace deepen
