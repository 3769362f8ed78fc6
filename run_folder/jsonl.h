// JSONL records: the one reader and writer of a run's metrics, eval and diagnostics files.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "run_folder/append_file.h"

namespace deepen {

// One JSON object per line, appended and flushed as it happens. The rule for a broken line is the
// same for every reader (the trainer's resume, the study runner, the report, the planner):
//   - a line is complete when it ends in '\n'; every complete line must be JSON, else InputError
//     "<path>:<line>: not JSON: <reason>" (a file damaged in the middle is not silently skipped);
//   - the last line without its '\n' is what a kill mid-write leaves (a torn record). If it does not
//     parse it is dropped with a warning on stderr naming the file and line; a record that is whole
//     but lacks only its newline is kept.
// Example: "{\"step\":0}\n{\"step\":1}\n{\"step\":2,\"lo" reads as steps 0 and 1, with a warning
// "<path>:3: dropped a torn last line ...".
std::vector<nlohmann::json> read_jsonl(const std::string& path);  // a missing file has no records

// The last complete record of a file that may be being written right now (the progress line of a
// live run): reads only the end of the file; a partial last line is skipped without a warning (it
// is normally still being written). nullopt when there is none or it does not parse.
std::optional<nlohmann::json> last_jsonl_record(const std::string& path);

// Rewrites `path` with the records `keep` accepts, through a temporary file + rename (a missing
// file stays missing; a failed write leaves the old file and names the OS's reason). A torn last
// line is dropped (read_jsonl's rule), so appending after a rewrite always starts on a fresh line.
void rewrite_jsonl(const std::string& path, const std::function<bool(const nlohmann::json&)>& keep);

// Appends records to one file, each as one line in one write: a killed run keeps every record it
// finished. Every write is checked (run_folder/append_file.h): a failed one throws
// std::runtime_error naming the file and the OS's reason, and leaves the file ending on its last
// whole record. Throws the same way when the file cannot be opened.
class JsonlWriter {
 public:
  explicit JsonlWriter(const std::string& path);
  void append(const nlohmann::json& record);

 private:
  AppendFile out_;
};

}  // namespace deepen
