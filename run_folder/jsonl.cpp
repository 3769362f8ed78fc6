// JSONL reading with one rule for torn and malformed lines; appending writer; rewrite on resume.
#include "run_folder/jsonl.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include "config/input_error.h"
#include "config/text_file.h"

namespace deepen {
namespace fs = std::filesystem;

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path, std::ios::binary);
  if (!in) return records;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t begin = 0;
  int64_t line_no = 0;
  while (begin < text.size()) {
    ++line_no;
    const size_t nl = text.find('\n', begin);
    const bool complete = nl != std::string::npos;
    const std::string line = text.substr(begin, (complete ? nl : text.size()) - begin);
    begin = complete ? nl + 1 : text.size();
    if (line.empty()) continue;
    try {
      records.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception& e) {
      if (complete)
        throw InputError(path + ":" + std::to_string(line_no) + ": not JSON: " + e.what());
      std::cerr << "deepen: WARNING: " << path << ":" << line_no
                << ": dropped a torn last line (a run killed while writing it): \""
                << line.substr(0, 60) << (line.size() > 60 ? "..." : "") << "\"\n";
    }
  }
  return records;
}

std::optional<nlohmann::json> last_jsonl_record(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return std::nullopt;
  const std::streamoff size = in.tellg();
  const std::streamoff start = std::max<std::streamoff>(0, size - 8192);
  in.seekg(start);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && text.back() != '\n') text.pop_back();  // a line still being written
  if (!text.empty()) text.pop_back();
  const size_t nl = text.rfind('\n');
  const std::string line = nl == std::string::npos ? text : text.substr(nl + 1);
  if (line.empty()) return std::nullopt;
  try {
    return nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // the window began inside a line longer than it, or a damaged file
  }
}

void rewrite_jsonl(const std::string& path, const std::function<bool(const nlohmann::json&)>& keep) {
  if (!fs::exists(path)) return;
  std::vector<nlohmann::json> kept;
  for (auto& record : read_jsonl(path)) {
    if (keep(record)) kept.push_back(std::move(record));
  }
  std::string text;
  for (const auto& r : kept) text += r.dump() + "\n";
  write_file_text(path, text, "the records kept for the resumed run");
}

JsonlWriter::JsonlWriter(const std::string& path) : out_(path, "a record") {}

void JsonlWriter::append(const nlohmann::json& record) { out_.append(record.dump() + "\n"); }

}  // namespace deepen
