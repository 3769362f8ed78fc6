// Test helpers for the control plane: a strict Prometheus text parser and bounded waiting.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace deepen::test {

// Polls `pred` every 5 ms until it holds or `timeout_s` passes; returns whether it held.
inline bool eventually(const std::function<bool()>& pred, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses Prometheus text exposition format 0.0.4 strictly: metric and label name grammar, label
// value escapes, float values, at most one HELP and TYPE per family and TYPE before its samples,
// a family's samples contiguous, no repeated series. Returns "" and fills `out`, or the first error.
inline std::string parse_prometheus(const std::string& text, std::vector<PromSample>& out) {
  auto is_name = [](const std::string& s, bool colon) {
    if (s.empty()) return false;
    for (size_t i = 0; i < s.size(); ++i) {
      const char c = s[i];
      const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
      if (!(alpha || (i > 0 && c >= '0' && c <= '9'))) return false;
    }
    return true;
  };
  if (!text.empty() && text.back() != '\n') return "text does not end with a newline";
  std::set<std::string> typed, helped, finished, series;
  std::string current;  // family whose samples are being read
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const std::string where = "line " + std::to_string(n) + " \"" + line + "\": ";
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::istringstream words(line.substr(1));
      std::string kind, name;
      words >> kind >> name;
      if (kind != "HELP" && kind != "TYPE") continue;  // plain comment
      if (!is_name(name, true)) return where + "bad metric name in " + kind;
      if (kind == "HELP") {
        if (!helped.insert(name).second) return where + "second HELP";
        const std::string help = line.substr(std::min(line.size(), 7 + name.size() + 1));
        for (size_t i = 0; i < help.size(); ++i) {
          if (help[i] == '\\' && (i + 1 >= help.size() || (help[i + 1] != '\\' && help[i + 1] != 'n'))) {
            return where + "bad escape in HELP";
          }
          if (help[i] == '\\') ++i;
        }
      } else {
        std::string type;
        words >> type;
        static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary", "untyped"};
        if (!kTypes.count(type)) return where + "unknown TYPE";
        if (!typed.insert(name).second) return where + "second TYPE";
        if (finished.count(name) || current == name) return where + "TYPE after samples";
      }
      continue;
    }
    PromSample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = line.substr(0, i);
    if (!is_name(s.name, true)) return where + "bad metric name";
    std::string canonical_labels;
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (true) {
        if (i < line.size() && line[i] == '}') { ++i; break; }
        size_t j = i;
        while (j < line.size() && line[j] != '=') ++j;
        const std::string key = line.substr(i, j - i);
        if (!is_name(key, false) || j + 1 >= line.size() || line[j + 1] != '"') return where + "bad label";
        std::string value;
        size_t k = j + 2;
        for (;; ++k) {
          if (k >= line.size()) return where + "unterminated label value";
          if (line[k] == '"') break;
          if (line[k] == '\\') {
            if (k + 1 >= line.size()) return where + "dangling backslash";
            const char e = line[++k];
            if (e == 'n') value += '\n';
            else if (e == '\\' || e == '"') value += e;
            else return where + "bad escape in label value";
          } else {
            value += line[k];
          }
        }
        if (!s.labels.emplace(key, value).second) return where + "repeated label";
        i = k + 1;
        if (i < line.size() && line[i] == ',') ++i;
        else if (i < line.size() && line[i] == '}') { ++i; break; }
        else return where + "expected ',' or '}' after a label";
      }
    }
    for (const auto& [k, v] : s.labels) canonical_labels += k + "=" + v + "\x1f";
    if (i >= line.size() || line[i] != ' ') return where + "expected a space before the value";
    const std::string rest = line.substr(i + 1);
    const std::string value_text = rest.substr(0, rest.find(' '));
    if (value_text == "NaN") s.value = std::nan("");
    else if (value_text == "+Inf") s.value = INFINITY;
    else if (value_text == "-Inf") s.value = -INFINITY;
    else {
      char* end = nullptr;
      s.value = std::strtod(value_text.c_str(), &end);
      if (value_text.empty() || *end != '\0') return where + "bad value";
    }
    if (s.name != current) {
      if (finished.count(s.name)) return where + "samples of a family are not contiguous";
      if (!current.empty()) finished.insert(current);
      current = s.name;
    }
    if (!series.insert(s.name + "\x1e" + canonical_labels).second) return where + "repeated series";
    out.push_back(std::move(s));
  }
  return "";
}

// The value of `name` with label rank=`rank`, or NaN when absent.
inline double prom_value(const std::vector<PromSample>& samples, const std::string& name,
                         const std::string& rank = "") {
  for (const auto& s : samples) {
    if (s.name != name) continue;
    const auto it = s.labels.find("rank");
    if (rank.empty() ? it == s.labels.end() : (it != s.labels.end() && it->second == rank)) return s.value;
  }
  return std::nan("");
}

}  // namespace deepen::test
