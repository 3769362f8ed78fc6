// What multi-rank tests share: the MPI session made by tests/mpi/main.cpp and small tensor helpers.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include <ATen/ATen.h>

#include "dist/mpi_session.h"

namespace deepen::test {

// The session owned by main() (MPI is initialized once per process).
const MpiSession& mpi();

// FNV-1a over a contiguous CPU tensor's bytes: equal checksums mean bit-identical tensors.
inline uint64_t bytes_checksum(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < static_cast<int64_t>(c.nbytes()); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// World ranks 0..n-1: the student list of a group whose communicator is the whole world.
inline std::vector<int> all_ranks(int n) {
  std::vector<int> out;
  for (int r = 0; r < n; ++r) out.push_back(r);
  return out;
}

// Bit-exact comparison (NaN payloads and signed zeros included).
inline bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

}  // namespace deepen::test
