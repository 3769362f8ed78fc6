// The whole of a file as a string, or an InputError naming the file and why it cannot be read.
#pragma once

#include <string>

namespace deepen {

// Reads `path` byte for byte. `what` names the file's role in the message:
// read_file_text("/x/tokenizer.json", "tokenizer file") on a missing file throws
// InputError("/x/tokenizer.json: cannot open tokenizer file: No such file or directory").
std::string read_file_text(const std::string& path, const std::string& what = "");

}  // namespace deepen
