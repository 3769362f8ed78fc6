// BlockGate: lets the owner of sharded block parameters materialize a block around its use.
#pragma once

#include <cstdint>

namespace deepen {

// Full sharding (parallel.sharding = "full", train/sharded_adamw.h) keeps each decoder block's
// trainable parameters as 1/S shards between uses. The student calls gather(i) before block i
// computes and release(i) once nothing needs its parameters any more: after a forward that keeps
// nothing (no grad mode, or inside recomputation) and after the block's recomputed backward.
// gather is collective over the students: every student runs the same blocks in the same order
// (the same forward and backward graph), so their calls pair up. gather of a gathered block and
// release of a released one do nothing.
class BlockGate {
 public:
  virtual ~BlockGate() = default;
  virtual void gather(int64_t block) = 0;
  virtual void release(int64_t block) = 0;
};

}  // namespace deepen
