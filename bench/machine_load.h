// Bench support: this machine's load averages, printed beside timings taken on a shared machine.
#pragma once

#include <fstream>
#include <string>

namespace deepen::bench {

// "1.52 2.10 2.33" (1, 5 and 15 minutes, /proc/loadavg), or "unknown" where it cannot be read.
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  if (!(in >> one >> five >> fifteen)) return "unknown";
  return one + " " + five + " " + fifteen;
}

}  // namespace deepen::bench
