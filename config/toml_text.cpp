// TOML quoting and parsing with errors that name file, line and column.
#include "config/toml_text.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "config/input_error.h"
#include "config/text_file.h"

namespace deepen {

std::string toml_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

toml::table parse_toml(const std::string& text, const std::string& source) {
  try {
    return toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw InputError(source + ":" + std::to_string(where.line) + ":" + std::to_string(where.column) +
                     ": malformed TOML: " + std::string(e.description()));
  }
}

toml::table parse_toml_file(const std::string& path, const std::string& what) {
  return parse_toml(read_file_text(path, what), path);
}

}  // namespace deepen
