// NCCL backend of Communicator for CUDA tensors (compiled only with DEEPEN_WITH_NCCL).
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace deepen {

class MpiSession;
class MpiCommunicator;

// The NCCL world: picks this rank's GPU from its node-local rank (node_local_rank, choose_cuda_device),
// makes it the current device, checks over MPI that no two ranks hold the same physical GPU
// (hostname + PCI bus id; NCCL forbids it), then creates the NCCL communicator from a unique id that
// rank 0 makes and broadcasts over MPI. Collective over MPI_COMM_WORLD.
// Set-up (of the world and of every split) runs under setup_timeout_s (control.nccl_setup_timeout_s):
// a rank that never arrives or NCCL that cannot connect the ranks (a wrong network interface) is a
// CommError naming the group's world ranks, this rank, and the NCCL network env (setup_deadline.h),
// not a hang until the scheduler's time limit.
//
// Semantics on top of the interface's:
// - Every operation runs on one communication stream per communicator (so NCCL sees operations in
//   the order they were issued), after the work already queued on the caller's current stream.
//   Blocking calls make the current stream wait for the result and return without blocking the
//   host; isend/irecv's wait() does the same; test() asks whether the GPU finished.
// - Tags are checked for range but not matched (NCCL matches in issue order per pair), and NCCL
//   cannot see a size mismatch: the logit channel's checksums catch a desynchronized sender.
// - abort() calls ncclCommAbort, which ends NCCL kernels stuck waiting for a dead peer, so a host
//   thread blocked on a stream synchronization returns; later calls throw CommError.
std::unique_ptr<Communicator> make_nccl_communicator(const MpiSession& mpi, double setup_timeout_s);

// A communicator over the ranks of `bootstrap` on CUDA device `device` (already checked distinct).
// Collective over bootstrap.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<MpiCommunicator> bootstrap, int device,
                                                    double setup_timeout_s);

}  // namespace deepen
