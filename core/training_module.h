#pragma once
// TrainingModule: the user's model as the Trainer sees it (Lightning's
// LightningModule, reduced to what a C++ training loop needs).
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace strata {

// ---- The unit seam --------------------------------------------------------
//
// C++ nn::Module has no forward hooks, so a model that wants strategies to act
// around its wrap units (FSDP gather/reshard, activation checkpointing,
// prefetch) names the units in wrap_units() and calls unit i as
//
//     x = run_unit(i, x, [block = blocks_[i].ptr()](const torch::Tensor& t) { return block->forward(t); });
//
// instead of `x = blocks_[i]->forward(x)`. Strategies install a UnitRunner on
// the module; run_unit() calls it (or the unit directly when none is
// installed). The contract, for models:
//  - Units are the modules of wrap_units(), in forward order; unit i is called
//    through run_unit(i, ...) once per forward, with one floating-point tensor
//    in and one out. Each unit owns its parameters; parameters in no unit
//    (embeddings, tied weights, the head) belong to the root.
//  - `forward` is self-contained: a runner may copy it and call it again after
//    run_unit() returns (activation checkpointing recomputes it during
//    backward). Capture the unit by value (its ModuleHolder / shared_ptr),
//    never references to the caller's locals.
//  - Calling `forward` twice on the same input with the same RNG and autocast
//    state gives the same result and has no other effect (no running
//    statistics updated in a unit, no in-place change of its input).
// For runners:
//  - A runner gets the unit index, the input and `forward`, "the rest of the
//    chain": calling it runs the inner runners and then the unit. It returns
//    the unit's output (it may wrap it, e.g. in a custom autograd Function).
//  - Runners compose as layers: compose_unit_runners(outer, inner) (or
//    module.add_unit_runner(layer)) makes `layer` the outermost one; the
//    first runner installed is innermost, next to the unit.
//  - Under torch::NoGradGuard (validation) the same runners run; a runner that
//    only matters for backward (checkpointing) passes straight through.

/// The body of one unit: the unit's forward, one tensor in, one out.
using UnitFn = std::function<torch::Tensor(const torch::Tensor&)>;

/// A layer around every unit call: (unit index, input, rest of the chain) ->
/// output. See the contract above.
using UnitRunner =
    std::function<torch::Tensor(int64_t unit, const torch::Tensor& x, const UnitFn& forward)>;

/// A runner that runs `outer` around `inner`: outer's `forward` argument calls
/// inner (with the same unit index and the unit's own forward). Either may be
/// empty (then the other is returned). Both are captured by value, so the
/// composed runner and the forwards it hands out stay valid on their own.
inline UnitRunner compose_unit_runners(UnitRunner outer, UnitRunner inner) {
  if (!outer) return inner;
  if (!inner) return outer;
  return [outer = std::move(outer), inner = std::move(inner)](
             int64_t unit, const torch::Tensor& x, const UnitFn& forward) {
    // By value: `rest` may be kept by `outer` and called after this returns.
    UnitFn rest = [inner, unit, forward](const torch::Tensor& t) { return inner(unit, t, forward); };
    return outer(unit, x, rest);
  };
}

/// One micro-batch: token ids and next-token targets (-1 = ignored position).
struct Batch {
  torch::Tensor input;   ///< int64 [B, T]
  torch::Tensor target;  ///< int64 [B, T], -1 where no loss is taken
};

/// What validation_step returns for one batch; sums, so that ranks and batches
/// combine exactly.
struct ValidationStep {
  double loss_sum = 0.0;       ///< sum of per-token losses over scored positions
  int64_t tokens = 0;          ///< scored positions
  int64_t correct_samples = 0; ///< samples whose every scored position is right
  int64_t samples = 0;
};

class TrainingModule {
 public:
  virtual ~TrainingModule() = default;

  /// The root module; strategies read and wrap its parameters.
  virtual torch::nn::Module& module() = 0;

  /// Forward + loss for one micro-batch; returns the scalar mean loss.
  virtual torch::Tensor training_step(const Batch& batch) = 0;

  /// Forward without grad; called under torch::NoGradGuard.
  virtual ValidationStep validation_step(const Batch& batch) = 0;

  /// The wrap units in forward order (see "The unit seam" above): the
  /// submodules FSDP shards and activation checkpointing wraps one by one,
  /// e.g. the transformer blocks; unit i is what run_unit(i, ...) runs. Each
  /// owns its parameters; the rest belong to the root. Empty: the model calls
  /// no units, and the whole model is one unit.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> wrap_units() { return {}; }

  /// Training FLOPs per token (forward + backward), for MFU; 0 if unknown.
  virtual double flops_per_token() const { return 0.0; }

  // ---- Deferred initialisation (core/deferred_init.h) ----------------------
  //
  // A module may be built deferred: its parameters have their final shapes
  // and dtypes but live on the meta device (no memory), so that a model that
  // only fits sharded can be built at all. The strategy's setup() gives each
  // parameter memory (the base: the whole module on its device; FSDP: one
  // unit at a time, as views of the unit's flat buffer) and then calls
  // init_parameter() for it. Eager construction must give the same values.

  /// True when some parameter of module() is deferred (on the meta device).
  bool has_deferred_parameters() {
    for (const auto& p : module().parameters(/*recurse=*/true)) {
      if (p.is_meta()) return true;
    }
    return false;
  }

  /// Writes the initial value of parameter `name` (qualified as in
  /// module().named_parameters()) into `param`, in place and without
  /// autograd. `param` already holds memory: possibly a view of a strategy's
  /// buffer, on any device. Called once per parameter, for units in any
  /// order: the value must depend on nothing but the parameter (its name, its
  /// shape, the module's seed). The default refuses: a module that can be
  /// built deferred overrides it.
  virtual void init_parameter(const std::string& name, const torch::Tensor& param) {
    TORCH_CHECK(false, "parameter ", name, " ", param.sizes(),
                " is deferred (meta device), but this TrainingModule does not implement "
                "init_parameter(): build it eagerly, or override init_parameter");
  }

  /// Replaces the runner run_unit() calls; an empty runner means "call the
  /// unit directly". To add a layer around what is installed, use
  /// add_unit_runner() (or compose_unit_runners(layer, unit_runner())).
  void set_unit_runner(UnitRunner runner) { unit_runner_ = std::move(runner); }
  /// The installed runner (empty when none).
  const UnitRunner& unit_runner() const { return unit_runner_; }
  /// Installs `layer` as the new outermost runner around the installed one.
  void add_unit_runner(UnitRunner layer) {
    unit_runner_ = compose_unit_runners(std::move(layer), std::move(unit_runner_));
  }

 protected:
  /// Runs unit `unit` on `x`: through the installed runner, or `forward(x)`
  /// when none is installed. Models call every wrap unit through this.
  torch::Tensor run_unit(int64_t unit, const torch::Tensor& x, const UnitFn& forward) const {
    TORCH_CHECK(unit >= 0, "run_unit: unit index must be >= 0 (got ", unit, ")");
    return unit_runner_ ? unit_runner_(unit, x, forward) : forward(x);
  }

 private:
  UnitRunner unit_runner_;
};

}  // namespace strata
