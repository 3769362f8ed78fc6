// A whole file as a string, read or written, with errors that name the file and the OS's reason.
#pragma once

#include <string>

namespace deepen {

// Reads `path` byte for byte. `what` names the file's role in the message:
// read_file_text("/x/tokenizer.json", "tokenizer file") on a missing file throws
// InputError("/x/tokenizer.json: cannot open tokenizer file: No such file or directory").
std::string read_file_text(const std::string& path, const std::string& what = "");

// Replaces `path` with `text` whole: written to `path`.tmp, every write and the close checked,
// then renamed over `path`, so a reader sees the old file or the new one, never half (a full disk
// leaves the old one and no temporary file). Throws std::runtime_error naming the file, `what` and
// the OS's reason, e.g. "runs/x/run.json: cannot write the run's metadata: No space left on device".
void write_file_text(const std::string& path, const std::string& text, const std::string& what);

}  // namespace deepen
