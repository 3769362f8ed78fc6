// Entry point of the multi-rank tests: MPI via MpiSession, output from rank 0 (failures from any
// rank, prefixed with it), and a non-zero exit on every rank when any rank failed.
#include <mpi.h>

#include <iostream>
#include <memory>
#include <string>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "tests/mpi/mpi_test_env.h"

namespace deepen::test {
namespace {

const MpiSession* g_session = nullptr;  // owned by main's stack; tests reach it through mpi()

// On ranks other than 0: only failed assertions, so the log stays readable with 8 ranks.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  // The name is kept here: UnitTest::current_test_info() would take gtest's lock, which is held
  // while part results are reported (a deadlock).
  void OnTestStart(const ::testing::TestInfo& info) override {
    test_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::cerr << "[rank " << rank_ << "] FAILED " << test_ << " at " << (r.file_name() ? r.file_name() : "?")
              << ":" << r.line_number() << "\n"
              << r.summary() << std::endl;
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace

const MpiSession& mpi() { return *g_session; }

}  // namespace deepen::test

int main(int argc, char** argv) {
  deepen::MpiSession session(&argc, &argv);
  deepen::test::g_session = &session;
  ::testing::InitGoogleTest(&argc, argv);
  at::set_num_threads(1);  // up to 8 ranks share 2 cores in CI
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (session.rank() != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new deepen::test::FailurePrinter(session.rank()));
  } else {
    std::cout << "deepen_mpi_tests: " << session.size() << " ranks, MPI thread level "
              << session.thread_level_name() << "\n";
  }
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (session.rank() == 0 && any_failed && !failed) std::cerr << "deepen_mpi_tests: another rank failed\n";
  return any_failed ? 1 : 0;
}
