// Activation recomputation: run a piece of the forward without keeping its activations, and run it
// again during the backward pass to get its gradients.
#pragma once

#include <functional>
#include <string>

#include <ATen/core/Tensor.h>

#include "config/options.h"

namespace deepen {

// student.recompute:
//   none:  every activation is kept for the backward pass (fastest, most memory).
//   layer: each decoder layer keeps only its input; its forward runs again in the backward pass
//          (activation memory ~ one layer's worth plus the layer inputs; about 1/3 more compute).
//   mlp:   only the MLP sub-layer is recomputed (pre-norm: its norm, the SwiGLU MLP and the residual
//          add; post-norm: MLP and add). The MLP's [tokens, intermediate] activations are the
//          largest of a layer: 3 x 12288 wide at Qwen3-8B's shapes against 4096.
// Gradients are the same as without recomputation: the same ops run on the same inputs
// (tests/model/recompute_test.cpp compares them bit for bit).
// (Recompute: config/options.h)

// fn(x) computed without recording its graph; in the backward pass fn runs again on x with grad
// enabled and its gradients flow to x and (accumulated into .grad) to every parameter fn uses.
// Outside grad mode it is just fn(x). fn must be deterministic (no dropout: deepen has none) and
// must not depend on state that changes between the forward and the backward pass.
// `done` (optional) runs once fn's results are no longer needed: after the forward (where nothing
// is kept) and again after the backward pass through fn. Full sharding releases a block's gathered
// parameters there (fn gathers them first).
at::Tensor recomputed(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x,
                      const std::function<void()>& done = nullptr);

}  // namespace deepen
