// Reading a whole file (see text_file.h).
#include "config/text_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "config/input_error.h"

namespace deepen {

std::string read_file_text(const std::string& path, const std::string& what) {
  const std::string role = what.empty() ? "" : " " + what;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open" + role + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InputError(path + ": cannot read" + role + ": " + std::strerror(errno));
  return text.str();
}

}  // namespace deepen
