// TOML text shared by the config, study and demo files: one quoting rule, one parse-error format.
#pragma once

#include <string>

#include <toml++/toml.h>

namespace deepen {

// A TOML basic string for `s`: quotes, backslashes and control characters escaped, so that
// "--set run.out_dir=" + toml_quote(path) reads back as exactly `path`.
//   toml_quote("runs/a \"b\"") -> "\"runs/a \\\"b\\\"\""
std::string toml_quote(const std::string& s);

// Parses TOML text. A syntax error throws InputError
//   "<source>:<line>:<column>: malformed TOML: <reason>".
toml::table parse_toml(const std::string& text, const std::string& source);

// Reads and parses a file (InputError "<path>: cannot read ..." when it cannot be opened).
toml::table parse_toml_file(const std::string& path, const std::string& what = "file");

}  // namespace deepen
