// Activation recomputation as a reentrant autograd function (the scheme of torch.utils.checkpoint
// with use_reentrant=True): the forward keeps only its input, the backward reruns the forward.
#include "model/recompute.h"

#include <torch/autograd.h>
#include <torch/custom_class.h>

#include "config/input_error.h"

namespace deepen {

namespace {

// The function to rerun, carried through the autograd context (which holds IValues) as a capsule.
struct RerunnableStep : torch::CustomClassHolder {
  RerunnableStep(std::function<at::Tensor(const at::Tensor&)> f, std::function<void()> d)
      : fn(std::move(f)), done(std::move(d)) {}
  std::function<at::Tensor(const at::Tensor&)> fn;
  std::function<void()> done;
};

class RecomputedFn : public torch::autograd::Function<RecomputedFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const c10::intrusive_ptr<RerunnableStep>& step) {
    // Custom functions run their forward with grad mode off: nothing inside step is recorded.
    ctx->save_for_backward({x});
    ctx->saved_data["step"] = c10::IValue::make_capsule(step);
    at::Tensor y = step->fn(x);
    if (step->done) step->done();
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto step = c10::static_intrusive_pointer_cast<RerunnableStep>(ctx->saved_data["step"].toCapsule());
    const at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    at::Tensor y;
    {
      at::AutoGradMode grad(true);
      y = step->fn(x);
    }
    // Reentrant: the parameters' gradients accumulate into their .grad as in the plain backward.
    torch::autograd::backward({y}, {grad_out[0]});
    if (step->done) step->done();
    return {x.grad(), at::Tensor()};
  }
};

}  // namespace

at::Tensor recomputed(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x,
                      const std::function<void()>& done) {
  if (!at::GradMode::is_enabled()) {
    at::Tensor y = fn(x);
    if (done) done();
    return y;
  }
  // The backward of a function whose inputs need no gradient never runs, and then neither would
  // the parameters' (a frozen embedding feeding layer 0): give the input a gradient of its own.
  const at::Tensor input = x.requires_grad() ? x : x.detach().requires_grad_(true);
  return RecomputedFn::apply(input, c10::make_intrusive<RerunnableStep>(fn, done));
}

}  // namespace deepen
