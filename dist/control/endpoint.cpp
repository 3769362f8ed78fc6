// Coordinator endpoint parsing and publishing through a file.
#include "dist/control/endpoint.h"

#include <unistd.h>

#include <chrono>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "config/input_error.h"

namespace deepen::control {

std::string this_host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

std::string Endpoint::str() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Endpoint parse_endpoint(std::string_view text, const std::string& origin) {
  auto fail = [&](const std::string& why) -> InputError {
    return InputError(origin + ": coordinator endpoint \"" + std::string(text) + "\": " + why);
  };
  Endpoint ep;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) throw fail("unclosed '['");
    ep.host = std::string(text.substr(1, close - 1));
    const std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') throw fail("expected ':' after ']'");
      port_text = rest.substr(1);
    }
  } else {
    const size_t colon = text.rfind(':');
    if (colon != std::string_view::npos && text.find(':') != colon) {
      throw fail("an IPv6 address must be written in brackets, e.g. [::1]:41234");
    }
    ep.host = std::string(text.substr(0, colon));
    if (colon != std::string_view::npos) port_text = text.substr(colon + 1);
  }
  if (ep.host.empty()) throw fail("empty host");
  if (!port_text.empty()) {
    unsigned port = 0;
    const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || port > 65535) {
      throw fail("port must be a number in 0..65535");
    }
    ep.port = uint16_t(port);
  }
  return ep;
}

std::optional<Endpoint> coordinator_from_env() {
  const char* text = std::getenv("DEEPEN_COORDINATOR");
  if (!text || !*text) return std::nullopt;
  return parse_endpoint(text, "DEEPEN_COORDINATOR");
}

void write_endpoint_file(const std::string& path, const Endpoint& endpoint) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << endpoint.str() << "\n";
    if (!out.flush()) throw std::runtime_error(tmp + ": cannot write the coordinator endpoint");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::runtime_error(path + ": cannot publish the coordinator endpoint");
  }
}

Endpoint wait_for_endpoint_file(const std::string& path, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    std::ifstream in(path);
    std::string line;
    if (in && std::getline(in, line) && !line.empty()) return parse_endpoint(line, path);
    if (std::chrono::steady_clock::now() >= deadline) {
      throw std::runtime_error(path + ": no coordinator endpoint appeared within " +
                               std::to_string(timeout_s) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace deepen::control
