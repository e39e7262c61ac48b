#include "strata/strategies/activation_checkpoint.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <mutex>
#include <optional>

namespace strata {

std::vector<std::string> checkpoint_policy_names() { return {"full", "attention", "op"}; }

void validate(const ActivationCheckpointOptions& options) {
  TORCH_CHECK_VALUE(options.every_n() >= 1,
                    "ActivationCheckpointOptions: every_n must be >= 1 (1 = every unit), got ",
                    options.every_n());
  const auto names = checkpoint_policy_names();
  TORCH_CHECK_VALUE(std::find(names.begin(), names.end(), options.policy()) != names.end(),
                    "ActivationCheckpointOptions: unknown policy '", options.policy(),
                    "'; available: ", c10::Join(", ", names));
}

bool checkpoints_unit(const ActivationCheckpointOptions& options, int64_t unit) {
  return unit % options.every_n() == 0;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// The thread-local autocast settings the forward ran under.
struct AutocastState {
  bool cpu_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  bool cuda_enabled = false;
  at::ScalarType cuda_dtype = at::kHalf;

  static AutocastState current() {
    return {at::autocast::is_autocast_enabled(at::kCPU), at::autocast::get_autocast_dtype(at::kCPU),
            at::autocast::is_autocast_enabled(at::kCUDA), at::autocast::get_autocast_dtype(at::kCUDA)};
  }
  bool any() const { return cpu_enabled || cuda_enabled; }
  void install() const {
    at::autocast::set_autocast_enabled(at::kCPU, cpu_enabled);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda_enabled);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
  }
};

/// RAII: the recompute runs under the forward's autocast state. Why: backward
/// runs outside the Trainer's autocast region, so without this a bf16-mixed
/// forward would be recomputed in fp32, giving other activations (and
/// gradients) than the ones the loss was computed from.
class AutocastReplay {
 public:
  explicit AutocastReplay(const AutocastState& forward) : previous_(AutocastState::current()) {
    forward.install();
    active_ = forward.any();
    if (active_) at::autocast::increment_nesting();
  }
  ~AutocastReplay() {
    // As leaving an autocast region does: the outermost one drops the cached
    // casts of the weights made in the recompute.
    if (active_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    previous_.install();
  }
  AutocastReplay(const AutocastReplay&) = delete;
  AutocastReplay& operator=(const AutocastReplay&) = delete;

 private:
  AutocastState previous_;
  bool active_ = false;
};

/// RAII: no autocast weight cache during the no-grad forward. Why: a cast made
/// under no-grad would be cached without autograd history, and a later use of
/// the same weight in this autocast region (outside the unit) would get that
/// copy and no gradient; the cache would also keep low-precision copies of
/// the unit's weights alive for the rest of the forward.
class NoAutocastCache {
 public:
  NoAutocastCache() : previous_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~NoAutocastCache() { at::autocast::set_autocast_cache_enabled(previous_); }
  NoAutocastCache(const NoAutocastCache&) = delete;
  NoAutocastCache& operator=(const NoAutocastCache&) = delete;

 private:
  bool previous_;
};

/// A handle sharing the default generator of `device` (CUDA through ATen's
/// device hooks: no CUDA header needed here).
at::Generator default_generator(const c10::Device& device) {
  return at::globalContext().defaultGenerator(device);
}

at::Tensor get_rng_state(at::Generator gen) {
  // The generator's own mutex, as torch.get_rng_state takes it: other threads
  // (thread-ranks, data loaders) may draw from the same default generator.
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(at::Generator gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

/// What a selective policy keeps of one checkpointed unit's forward, in call
/// order (an empty entry: an op it did not keep), and where the recompute is.
struct KeptOps {
  bool attention = false;   ///< the policy keeps attention ops
  bool matmuls = false;     ///< ... and every other matmul
  bool replaying = false;   ///< false: the forward records; true: the recompute replays
  int64_t matmuls_seen = 0;
  struct Entry {
    KeptOp kind;
    std::vector<torch::Tensor> outputs;  ///< empty: not kept
  };
  std::vector<Entry> kept;
  size_t next = 0;          ///< the recompute's position in `kept`

  bool keeps(KeptOp kind) {
    if (kind == KeptOp::attention) return attention;
    return matmuls && (matmuls_seen++ % 2 == 0);  // the 1st, 3rd, ... (torchtitan's mm count)
  }
};

/// The KeptOps of the unit this thread is running (nullptr: none, or a unit
/// under the "full" policy).
thread_local KeptOps* kept_ops = nullptr;

/// RAII: `ops` is this thread's KeptOps while it lives (nesting restores the outer).
class KeptOpsScope {
 public:
  explicit KeptOpsScope(KeptOps* ops) : previous_(kept_ops) { kept_ops = ops; }
  ~KeptOpsScope() { kept_ops = previous_; }
  KeptOpsScope(const KeptOpsScope&) = delete;
  KeptOpsScope& operator=(const KeptOpsScope&) = delete;

 private:
  KeptOps* previous_;
};

/// What the backward needs besides the saved input.
struct CheckpointState : torch::CustomClassHolder {
  UnitFn forward;
  bool input_requires_grad = false;
  AutocastState autocast;
  bool preserve_rng_state = true;
  at::Tensor cpu_rng;                 // CPU generator state before the forward
  std::optional<c10::Device> cuda_device;
  at::Tensor cuda_rng;                // that device's generator state, if CUDA input
  std::optional<KeptOps> ops;         // a selective policy's kept outputs
};

/// RAII: the recompute draws from the forward's RNG state; afterwards the
/// generators continue from where they were when backward reached the unit
/// (torch.random.fork_rng semantics), so the recompute consumes nothing from
/// the streams that later random ops see.
class RngReplay {
 public:
  explicit RngReplay(const CheckpointState& state) {
    if (!state.preserve_rng_state) return;
    cpu_ = default_generator(c10::Device(c10::kCPU));
    cpu_now_ = get_rng_state(*cpu_);
    set_rng_state(*cpu_, state.cpu_rng);
    if (state.cuda_device) {
      cuda_ = default_generator(*state.cuda_device);
      cuda_now_ = get_rng_state(*cuda_);
      set_rng_state(*cuda_, state.cuda_rng);
    }
  }
  ~RngReplay() {
    if (cpu_) set_rng_state(*cpu_, cpu_now_);
    if (cuda_) set_rng_state(*cuda_, cuda_now_);
  }
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  std::optional<at::Generator> cpu_, cuda_;
  at::Tensor cpu_now_, cuda_now_;
};

thread_local bool recomputing = false;

/// RAII: is_recomputing() is true on this thread while it lives.
class RecomputeScope {
 public:
  RecomputeScope() : previous_(recomputing) { recomputing = true; }
  ~RecomputeScope() { recomputing = previous_; }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  bool previous_;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  /// `anchor`: a tensor requiring grad, passed only when `x` does not require
  /// grad (see checkpoint()); otherwise nullopt.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const c10::optional<torch::Tensor>& /*anchor*/,
                               const c10::intrusive_ptr<CheckpointState>& state) {
    // Function::apply runs this under no-grad: the unit builds no graph and
    // its activations are freed as soon as the forward is done with them.
    if (state->preserve_rng_state) {
      // Before the unit draws anything, so that the recompute draws the same.
      state->cpu_rng = get_rng_state(default_generator(c10::Device(c10::kCPU)));
      if (x.is_cuda()) {
        state->cuda_device = x.device();
        state->cuda_rng = get_rng_state(default_generator(x.device()));
      }
    }
    state->autocast = AutocastState::current();
    torch::Tensor out;
    {
      NoAutocastCache no_cache;
      KeptOpsScope keep(state->ops ? &*state->ops : nullptr);
      out = state->forward(x);
    }
    TORCH_CHECK(out.defined() && out.is_floating_point(),
                "checkpoint: a checkpointed unit must return a defined floating-point tensor (got ",
                out.defined() ? c10::toString(out.scalar_type()) : "an undefined tensor", ")");
    ctx->save_for_backward({x});
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // The engine runs a backward with create_graph=true in grad mode; the
    // recompute's graph is consumed right here, so it cannot be differentiated
    // again.
    TORCH_CHECK(!torch::GradMode::is_enabled(),
                "checkpoint: create_graph (double backward) through a checkpointed unit is not "
                "supported");
    auto saved = ctx->get_saved_variables();  // errors if already freed (second backward)
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(
        ctx->saved_data.at("state").toCapsule());
    // Detached: the recompute's graph starts at this fresh leaf, so backward
    // below stops here and returns the input's gradient to the outer graph
    // through this Function, instead of running into the graph before the unit.
    auto x = saved[0].detach();
    x.requires_grad_(state->input_requires_grad);
    torch::Tensor out;
    {
      RngReplay rng(*state);
      AutocastReplay autocast(state->autocast);
      RecomputeScope recompute;
      if (state->ops) state->ops->replaying = true;
      KeptOpsScope keep(state->ops ? &*state->ops : nullptr);
      torch::AutoGradMode grad(true);
      out = state->forward(x);
      // The kept outputs now belong to the recomputed graph (or were never
      // used); the state lets go of them either way.
      if (state->ops) {
        TORCH_CHECK(state->ops->next == state->ops->kept.size(), "checkpoint: the recompute ran ",
                    state->ops->next, " of the ", state->ops->kept.size(),
                    " selectively checkpointed ops the forward ran; a unit must be repeatable");
        state->ops.reset();
      }
    }
    if (out.requires_grad()) {
      // A nested (reentrant) backward through the recomputed graph. The unit's
      // parameters are the same leaf tensors as in any backward, so autograd
      // routes their gradients to the same AccumulateGrad nodes: .grad
      // accumulates as usual and the post-hooks strategies put on those nodes
      // (DDP/SDP bucket readiness) fire, once per parameter per backward.
      torch::autograd::backward({out}, {grad_outputs[0]});
    }
    torch::Tensor grad_x = state->input_requires_grad ? x.grad() : torch::Tensor();
    return {grad_x, torch::Tensor(), torch::Tensor()};
  }
};

/// The dtype torch::linear would compute `x` in under the current autocast.
at::ScalarType linear_compute_dtype(const torch::Tensor& x) {
  const auto type = x.device().type();
  // Autocast exists for CPU and CUDA tensors only (the dry run's are meta:
  // asking about those throws).
  const bool autocast_device = type == c10::kCPU || type == c10::kCUDA;
  if (autocast_device && at::autocast::is_autocast_enabled(type) && at::isFloatingType(x.scalar_type())) {
    return at::autocast::get_autocast_dtype(type);
  }
  return x.scalar_type();
}

/// A Linear's backward without its forward's product: the output is given
/// (`out`: a kept output, for checkpointed_linear's replay) or zeros (for
/// linear_output_unread_in_recompute, whose output nothing reads).
class LinearBackwardOnly : public torch::autograd::Function<LinearBackwardOnly> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const c10::optional<torch::Tensor>& bias, at::ScalarType dtype,
                               const c10::optional<torch::Tensor>& out) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    ctx->saved_data["has_bias"] = bias.has_value();
    if (bias) ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias->scalar_type());
    if (out) return *out;
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(0);
    return torch::zeros(sizes, x.options().dtype(dtype));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& weight = saved[1];
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data.at("dtype").toInt());
    const auto g = grad_outputs[0].to(dtype).reshape({-1, weight.size(0)});
    // Only what autograd asks for (a frozen weight, e.g. under LoRA, gets no
    // GEMM), as ATen's own linear backward does.
    torch::Tensor grad_x, grad_w, grad_b;
    if (ctx->needs_input_grad(0)) grad_x = g.mm(weight.to(dtype)).reshape(x.sizes()).to(x.scalar_type());
    if (ctx->needs_input_grad(1)) grad_w = g.t().mm(x.to(dtype).reshape({-1, weight.size(1)})).to(weight.scalar_type());
    if (ctx->saved_data.at("has_bias").toBool() && ctx->needs_input_grad(2)) {
      grad_b = g.sum(0).to(static_cast<at::ScalarType>(ctx->saved_data.at("bias_dtype").toInt()));
    }
    return {grad_x, grad_w, grad_b, torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor linear_backward_only(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                   const c10::optional<torch::Tensor>& out, const char* caller) {
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 2 && x.size(-1) == weight.size(1), caller, ": input ", x.sizes(),
              " does not fit weight ", weight.sizes());
  c10::optional<torch::Tensor> b;
  if (bias.defined()) b = bias;
  return LinearBackwardOnly::apply(x, weight, b, linear_compute_dtype(x), out);
}

}  // namespace

bool is_recomputing() { return recomputing; }

torch::Tensor linear_output_unread_in_recompute(const torch::Tensor& x, const torch::Tensor& weight,
                                                const torch::Tensor& bias) {
  if (!recomputing || !torch::GradMode::is_enabled()) return torch::linear(x, weight, bias);
  return linear_backward_only(x, weight, bias, c10::nullopt, "linear_output_unread_in_recompute");
}

torch::Tensor checkpointed_op(const CheckpointedOp& op) {
  KeptOps* ops = kept_ops;
  if (ops == nullptr) return op.run();
  if (!ops->replaying) {
    // The checkpointed forward (no grad): keep the output if the policy says so.
    if (!ops->keeps(op.kind)) {
      ops->kept.push_back({op.kind, {}});
      return op.run();
    }
    auto kept = op.save();
    TORCH_CHECK(!kept.empty() && kept[0].defined(), "checkpointed_op: save() must return the op's output first");
    ops->kept.push_back({op.kind, kept});
    return kept[0];
  }
  // The recompute: the same ops in the same order, each kept one replayed.
  TORCH_CHECK(ops->next < ops->kept.size() && ops->kept[ops->next].kind == op.kind,
              "checkpoint: the recompute ran a selectively checkpointed op (number ", ops->next + 1,
              ") that the forward did not run there; a unit must be repeatable");
  auto kept = std::move(ops->kept[ops->next++].outputs);
  if (kept.empty()) return op.run();
  return op.replay(std::move(kept));
}

torch::Tensor checkpointed_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (kept_ops == nullptr) return torch::linear(x, weight, bias);  // no std::function on the common path
  CheckpointedOp op;
  op.kind = KeptOp::matmul;
  op.run = [&] { return torch::linear(x, weight, bias); };
  op.save = [&] { return std::vector<torch::Tensor>{torch::linear(x, weight, bias)}; };
  op.replay = [&](std::vector<torch::Tensor> kept) {
    return linear_backward_only(x, weight, bias, std::move(kept[0]), "checkpointed_linear");
  };
  return checkpointed_op(op);
}

torch::Tensor checkpoint(const UnitFn& forward, const torch::Tensor& x, bool preserve_rng_state) {
  return checkpoint(forward, x, ActivationCheckpointOptions().preserve_rng_state(preserve_rng_state));
}

torch::Tensor checkpoint(const UnitFn& forward, const torch::Tensor& x, const ActivationCheckpointOptions& options) {
  TORCH_CHECK(forward, "checkpoint: forward is empty");
  if (!torch::GradMode::is_enabled()) return forward(x);  // nothing to save for
  validate(options);
  auto state = c10::make_intrusive<CheckpointState>();
  state->forward = forward;
  state->input_requires_grad = x.requires_grad();
  state->preserve_rng_state = options.preserve_rng_state();
  if (options.policy() != "full") {
    state->ops.emplace();
    state->ops->attention = true;  // both selective policies keep attention
    state->ops->matmuls = options.policy() == "op";
  }
  // Why an anchor: a Function whose inputs all lack requires_grad is left out
  // of the graph, and its backward (the recompute, which is where the unit's
  // parameters get their gradients) would never run, e.g. for a first unit
  // fed raw data. The anchor is a 0-element leaf that requires grad; its
  // gradient is always undefined, so its AccumulateGrad does nothing.
  c10::optional<torch::Tensor> anchor;
  if (!x.requires_grad()) anchor = torch::empty({0}, x.options().requires_grad(true));
  return CheckpointFunction::apply(x, anchor, state);
}

UnitRunner checkpoint_runner(const ActivationCheckpointOptions& options, UnitRunner inner) {
  validate(options);
  return [options, inner = std::move(inner)](int64_t unit, const torch::Tensor& x,
                                             const UnitFn& forward) -> torch::Tensor {
    if (!checkpoints_unit(options, unit)) return inner ? inner(unit, x, forward) : forward(x);
    if (!inner) return checkpoint(forward, x, options);
    // By value: the recompute calls this again during backward.
    UnitFn rest = [inner, unit, forward](const torch::Tensor& t) { return inner(unit, t, forward); };
    return checkpoint(rest, x, options);
  };
}

void apply_activation_checkpointing(TrainingModule& module, const ActivationCheckpointOptions& options) {
  TORCH_CHECK_VALUE(!module.wrap_units().empty(),
                    "apply_activation_checkpointing: the module names no wrap units "
                    "(TrainingModule::wrap_units() is empty), so there is nothing to checkpoint; "
                    "override wrap_units() and call each unit through run_unit()");
  module.set_unit_runner(checkpoint_runner(options, module.unit_runner()));
}

}  // namespace strata
