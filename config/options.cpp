// The error of a misspelt option, out of line so the header stays free of InputError's includes.
#include "config/options.h"

#include "config/input_error.h"

namespace deepen {

void throw_unknown_option(const std::string& where, const std::string& choices, std::string_view got) {
  throw InputError(where + ": must be " + choices + ", got \"" + std::string(got) + "\"");
}

}  // namespace deepen
