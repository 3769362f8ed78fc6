// AppendFile: a record file appended to record by record, every write checked.
#pragma once

#include <string>
#include <string_view>

namespace deepen {

// One write(2) per record, no user-space buffer: a record is in the kernel (what a kill leaves) as
// soon as append() returns, and a failed write is seen by the append that made it, not by a flush
// some records later. A failure throws std::runtime_error naming the file, `what` and the OS's
// reason ("runs/x/metrics.jsonl: cannot append a metrics record: No space left on device"), after
// cutting the file back to its size before the record: a record half written by a full disk is
// taken back, so the file still ends on a whole record. After a failure the file refuses further
// appends (the same error again): records are never written past a gap.
class AppendFile {
 public:
  // Opens (creating) `path` for appending; throws std::runtime_error naming it and the OS's reason.
  AppendFile(std::string path, std::string what);
  ~AppendFile();
  AppendFile(AppendFile&& other) noexcept;
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  AppendFile& operator=(AppendFile&&) = delete;

  void append(std::string_view bytes);
  const std::string& path() const { return path_; }

 private:
  std::string path_, what_;
  int fd_ = -1;
  std::string failure_;  // the first failure's message; non-empty: every append throws it
};

}  // namespace deepen
