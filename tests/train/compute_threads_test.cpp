// The warning for compute threads that must share fewer cores than run.threads asks for.
#include <gtest/gtest.h>

#include "train/compute_threads.h"

namespace deepen {
namespace {

TEST(ComputeThreads, ThreadsSharingFewerCoresAreWarnedAboutWithTheFix) {
  const std::string w = thread_binding_warning("rank 1", 2, 1);
  EXPECT_NE(w.find("rank 1: run.threads = 2, but its CPU affinity allows 1 core"), std::string::npos) << w;
  EXPECT_NE(w.find("2.0x slower"), std::string::npos) << w;
  EXPECT_NE(w.find("--bind-to none"), std::string::npos) << w;
  EXPECT_NE(w.find("--cpus-per-task"), std::string::npos) << w;
  EXPECT_NE(thread_binding_warning("rank 0", 8, 3).find("allows 3 cores: the threads take turns (steps up to 2.7x"),
            std::string::npos);
}

TEST(ComputeThreads, ThreadsThatEachHaveACoreAreNotWarnedAbout) {
  EXPECT_EQ(thread_binding_warning("rank 0", 2, 2), "");
  EXPECT_EQ(thread_binding_warning("rank 0", 1, 16), "");
}

TEST(ComputeThreads, ZeroThreadsMeansEveryAllowedCore) {
  EXPECT_EQ(set_compute_threads(0), allowed_cores());
}

}  // namespace
}  // namespace deepen
