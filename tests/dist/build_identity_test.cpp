// The build identity every rank sends at start, and the refusal of a job whose ranks run different builds.
#include "dist/build_identity.h"

#include <gtest/gtest.h>

#include "config/input_error.h"

namespace deepen {
namespace {

TEST(BuildIdentity, ThisExecutableHasTheBuildIdItsLinkerWrote) {
  const std::string id = this_build_id();
  // gcc's default --build-id is a SHA-1: 20 bytes, 40 hex digits (readelf -n shows the same).
  EXPECT_EQ(id.size(), 40u) << id;
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
}

TEST(BuildIdentity, OneBuildOnEveryRankPasses) {
  EXPECT_NO_THROW(check_same_build({"n1", "n1", "n2"}, {"ab", "ab", "ab"}));
}

TEST(BuildIdentity, RanksOnAnotherBuildAreRefusedNamingBothBuildsTheirRanksAndHosts) {
  const std::string ours(40, 'a'), stale = "0123456789ab" + std::string(28, 'f');
  try {
    check_same_build({"n1", "n1", "n2", "n2"}, {ours, ours, stale, stale});
    FAIL() << "two builds passed";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "the ranks run different builds of deepen: build aaaaaaaaaaaa on rank 0 (n1), rank 1 (n1); "
                 "build 0123456789ab on rank 2 (n2), rank 3 (n2); install one build on every node (a stale "
                 "binary on a node's path?) and start the job again");
  }
}

TEST(BuildIdentity, ARankTooOldToSendAnIdIsNamedAsSuch) {
  try {
    check_same_build({"n1", "n2"}, {std::string(40, 'a'), ""});
    FAIL() << "a rank without an id passed";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("build (none: a build without an id, or an older deepen) on rank 1 (n2)"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepen
