// Communicator factory (backend choice), host-side waits, and the layout's groups split from the world.
#include "dist/communicator.h"

#include "dist/mpi_session.h"
#include "dist/rank_layout.h"
#include "dist/wait_backoff.h"
#ifdef DEEPEN_WITH_NCCL
#include <c10/cuda/CUDAFunctions.h>

#include "dist/nccl_communicator.h"
#endif

namespace deepen {

void wait_on_host(Request& request) {
  request.wait();
  // test() throws CommError on abort, so a dead peer cannot keep this loop spinning. Paced as the MPI
  // waits are: a teacher waiting a whole student step for room in its channel leaves the cores.
  WaitBackoff backoff;
  while (!request.test()) backoff.pause();
}

bool nccl_available() {
#ifdef DEEPEN_WITH_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> make_communicator(Backend backend, const MpiSession& mpi, double nccl_setup_timeout_s) {
  if (backend == Backend::kMpi) return make_mpi_communicator(mpi);
  if (backend == Backend::kAuto) throw std::logic_error("make_communicator: parallel.backend not resolved (world_backend)");
#ifdef DEEPEN_WITH_NCCL
  return make_nccl_communicator(mpi, nccl_setup_timeout_s);
#else
  (void)nccl_setup_timeout_s;
  throw std::logic_error("make_communicator: NCCL asked of a build without it (world_backend refuses that)");
#endif
}

RankGroups make_rank_groups(Communicator& world, const RankLayout& layout) {
  if (world.size() != layout.world_size)
    throw std::invalid_argument("make_rank_groups: communicator of " + std::to_string(world.size()) +
                                " ranks for a layout of " + std::to_string(layout.world_size));
  RankGroups g;
  const GroupSlot p = layout.slot(world.rank(), GroupKind::kTeacherPipeline);
  g.teacher_pipeline = world.split(p.color, p.key);
  const GroupSlot c = layout.slot(world.rank(), GroupKind::kLogitChannel);
  g.logit_channel = world.split(c.color, c.key);
  const GroupSlot s = layout.slot(world.rank(), GroupKind::kStudents);
  g.students = world.split(s.color, s.key);
  return g;
}

}  // namespace deepen
