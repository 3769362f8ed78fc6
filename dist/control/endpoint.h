// Coordinator endpoint: "host:port" parsing, DEEPEN_COORDINATOR, and a file to publish it through.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace deepen::control {

struct Endpoint {
  std::string host;   // name or address ("node01", "10.0.0.5", "::1")
  uint16_t port = 0;  // 0 = not chosen yet (the coordinator binds a free port)
  std::string str() const;  // "node01:41234", "[::1]:41234"
  bool operator==(const Endpoint&) const = default;
};

// This machine's host name (gethostname), "localhost" if it has none: how other nodes reach it by
// default, and how messages name it.
std::string this_host_name();

// "node01:41234", "node01" (port 0), "[::1]:41234". Throws InputError naming `origin` on a
// malformed text or a port outside 0..65535.
Endpoint parse_endpoint(std::string_view text, const std::string& origin);

// DEEPEN_COORDINATOR if set (the sbatch scripts set it to the allocation's first node), else nullopt.
std::optional<Endpoint> coordinator_from_env();

// For launchers without MPI: the coordinator's rank writes its endpoint (atomically: temporary name,
// then rename), the other ranks poll for it on a shared filesystem. wait_for_endpoint_file throws
// std::runtime_error naming the path when `timeout_s` passes first.
void write_endpoint_file(const std::string& path, const Endpoint& endpoint);
Endpoint wait_for_endpoint_file(const std::string& path, double timeout_s);

}  // namespace deepen::control
