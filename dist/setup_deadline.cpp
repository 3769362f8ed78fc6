// Communicator set-up under a deadline (pure): the polling wait and the timeout message.
#include "dist/setup_deadline.h"

#include <sstream>

namespace deepen {

bool wait_with_deadline(const std::function<SetupPoll()>& poll,
                        const std::function<std::chrono::steady_clock::time_point()>& now,
                        const std::function<void()>& pause, double timeout_s) {
  const auto start = now();
  const std::chrono::duration<double> limit(timeout_s < 0 ? 0 : timeout_s);
  for (;;) {
    if (poll() == SetupPoll::kDone) return true;
    if (now() - start > limit) return false;
    pause();
  }
}

std::string nccl_network_env(const std::function<const char*(const char*)>& getenv) {
  std::string out;
  for (const char* name : {"NCCL_SOCKET_IFNAME", "NCCL_SOCKET_FAMILY", "NCCL_IB_HCA", "NCCL_IB_DISABLE", "NCCL_NET",
                           "NCCL_DEBUG"}) {
    const char* value = getenv(name);
    out += std::string(out.empty() ? "" : ", ") + name + (value ? std::string("=") + value : std::string(" unset"));
  }
  return out;
}

std::string setup_timeout_message(const SetupTimeout& t, const std::string& nccl_env) {
  std::ostringstream m;
  m << "NCCL set-up of the group of world ranks ";
  for (size_t i = 0; i < t.group_world_ranks.size(); ++i) m << (i ? ", " : "") << t.group_world_ranks[i];
  m << " timed out on world rank " << t.world_rank << " (" << t.host << ", cuda:" << t.device << "): ";
  std::ostringstream limit;
  limit << "control.nccl_setup_timeout_s = " << t.timeout_s << " s";
  if (t.stage == SetupStage::kRanksArriving) {
    m << "not every rank reached it within " << limit.str()
      << "; a rank is stuck before it or died (look for the first error in the other ranks' output)";
  } else {
    m << "all " << t.group_world_ranks.size() << " ranks reached ncclCommInitRank but NCCL did not connect them within "
      << limit.str()
      << "; usually NCCL picked a network interface the nodes cannot reach each other on: set NCCL_SOCKET_IFNAME "
         "(and NCCL_IB_HCA) for this cluster, and rerun with NCCL_DEBUG=INFO to see NCCL's choice. NCCL env: "
      << nccl_env;
  }
  return m.str();
}

}  // namespace deepen
