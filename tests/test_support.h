// What many tests need: the message of an expected InputError, and a fresh scratch folder.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

#include "config/input_error.h"
#include "tests/test_paths.h"

namespace deepen::test {

// The message of the InputError `f` throws, "" when it throws none (any other exception escapes and
// fails the test), so a test asserts on what the user would read:
//   EXPECT_NE(error_of([] { parse_config("[x]", "x.toml"); }).find("unknown section"), std::string::npos);
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// <build>/test_scratch/<suite>/<name>: emptied and created, left behind for a look after a failure.
inline std::filesystem::path scratch_dir(const std::string& suite, const std::string& name) {
  const auto dir = std::filesystem::path(kBinaryDir) / "test_scratch" / suite / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace deepen::test
