// TOML text: quoting that reads back exactly, and parse errors naming file, line and column.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/toml_text.h"
#include "tests/test_support.h"

namespace deepen {
namespace {

TEST(TomlText, QuotedStringsReadBackExactly) {
  for (const std::string s : std::vector<std::string>{"runs/a b", "quote \" and backslash \\", "tab\tnewline\n", std::string("nul\x01", 4), ""}) {
    const toml::table t = parse_toml("v = " + toml_quote(s), "q.toml");
    EXPECT_EQ(t["v"].value<std::string>(), s) << toml_quote(s);
  }
  EXPECT_EQ(toml_quote("runs/a \"b\""), "\"runs/a \\\"b\\\"\"");
}

TEST(TomlText, MalformedTextNamesFileLineAndColumn) {
  const std::string e = test::error_of([] { parse_toml("[a]\nx = = 1\n", "bad.toml"); });
  EXPECT_EQ(e.rfind("bad.toml:2:", 0), 0u) << e;
  EXPECT_NE(e.find("malformed TOML"), std::string::npos) << e;
  EXPECT_NE(test::error_of([] { parse_toml_file("/nonexistent/x.toml", "study file"); }).find("/nonexistent/x.toml: cannot open study file"),
            std::string::npos);
}

}  // namespace
}  // namespace deepen
