#pragma once
// Activation checkpointing: trade compute for activation memory, per wrap unit.
//
// A checkpointed unit runs its forward under no-grad and keeps only its input;
// backward recomputes the forward with grad enabled from that input and
// back-propagates through the recomputed graph (a custom autograd Function,
// torch.utils.checkpoint's reentrant variant). The parameters' gradients
// accumulate through their usual AccumulateGrad nodes, so gradient hooks that
// strategies put there (DDP/SDP buckets) fire as without checkpointing. The
// recompute replays the forward's RNG state (same dropout masks) and autocast
// state (same precision).
//
// It is a layer of the unit seam (core/training_module.h), usable under every
// strategy and composable with other layers. Install it before a layer that
// must sit outside it: FSDP(checkpoint(block)) = apply_activation_checkpointing
// first, FSDP's runner after.
//
// For authors of other layers and strategies:
//  - Layers inside the checkpoint (installed before it) run twice per step for
//    checkpointed units: under no-grad in the forward, then with grad during
//    backward, when backward reaches the unit (so FSDP inside must gather
//    again there). Layers outside run once per forward and see their output's
//    backward before the recompute.
//  - The recompute's backward is a nested (reentrant) torch::autograd::backward
//    inside this Function's backward. Hooks on tensors and AccumulateGrad
//    nodes fire as usual, but a callback queued with Engine::queue_callback
//    from inside it runs when the NESTED backward ends, not the outer one
//    (the known DDP + reentrant checkpoint pitfall): don't rely on it.
//  - The RNG state replayed is the process-wide default generator's. Ranks as
//    threads share it, so random ops under run_thread_world are not
//    reproducible per rank, with or without checkpointing.
//
// Selective checkpointing (options.policy "attention" or "op", torchtitan's
// op-level SAC): the unit runs the ops it allows to be kept through
// checkpointed_op() (checkpointed_linear for a Linear). In the checkpointed
// forward the policy's ops keep their outputs; the recompute runs the unit
// again, but each kept op hands back its output with its backward attached
// instead of computing it. The ops must run in the same order both times.
//
// Example:
//   strata::apply_activation_checkpointing(module, strata::ActivationCheckpointOptions().every_n(2));
//   strata::apply_activation_checkpointing(module, strata::ActivationCheckpointOptions().policy("op"));
#include "strata/core/training_module.h"

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace strata {

struct ActivationCheckpointOptions {
  /// Which units are checkpointed: those whose index is a multiple of every_n
  /// (1: every unit; 2: units 0, 2, 4, ...; n: 0, n, 2n, ...). Must be >= 1.
  TORCH_ARG(int64_t, every_n) = 1;
  /// Replay the CPU generator (and, for CUDA inputs, that device's generator)
  /// in the recompute, so random ops (dropout) draw what the forward drew.
  /// false saves the two state copies per unit when the units draw nothing.
  TORCH_ARG(bool, preserve_rng_state) = true;
  /// What a checkpointed unit keeps of its forward besides its input, so that
  /// its recompute skips those ops (selective activation checkpointing):
  ///  - "full": nothing; the whole unit is recomputed (the default).
  ///  - "attention": the output of each attention op (and its logsumexp): the
  ///    recompute runs no attention.
  ///  - "op": attention's outputs and every other matmul's output (the 1st,
  ///    3rd, ... in the unit), as torchtitan's op-level SAC keeps mm outputs.
  /// Only ops the unit runs through checkpointed_op() can be kept
  /// (checkpointed_linear; the GPT's fused CPU attention); others are
  /// recomputed under every policy.
  TORCH_ARG(std::string, policy) = "full";
};

/// The policies ActivationCheckpointOptions::policy accepts.
std::vector<std::string> checkpoint_policy_names();

/// Errors (naming the value) for every_n < 1 or an unknown policy.
void validate(const ActivationCheckpointOptions& options);

/// True when `options` checkpoints unit `unit`.
bool checkpoints_unit(const ActivationCheckpointOptions& options, int64_t unit);

/// Runs `forward(x)` checkpointed: returns its output with a backward that
/// recomputes `forward` from `x`. `forward` is copied and called again during
/// backward, so it must stay valid and be repeatable (the unit seam's
/// contract). Without grad mode it is just `forward(x)`. Not supported:
/// create_graph (double backward) through the checkpointed region.
torch::Tensor checkpoint(const UnitFn& forward, const torch::Tensor& x, bool preserve_rng_state = true);
/// The same with `options`' preserve_rng_state and policy (every_n is the
/// runner's business and ignored here).
torch::Tensor checkpoint(const UnitFn& forward, const torch::Tensor& x, const ActivationCheckpointOptions& options);

/// A unit runner that checkpoints the units `options` selects and calls
/// `inner` (may be empty: the unit itself) inside. The recompute calls inner
/// again, during backward, for the checkpointed units only.
UnitRunner checkpoint_runner(const ActivationCheckpointOptions& options, UnitRunner inner = nullptr);

/// Installs checkpoint_runner(options, <installed runner>) on `module`, as the
/// outermost layer. Errors if the module names no wrap units.
void apply_activation_checkpointing(TrainingModule& module, const ActivationCheckpointOptions& options);

/// True on this thread while a checkpointed unit's forward is being
/// recomputed for its backward.
bool is_recomputing();

/// torch::linear(x, weight, bias) for a Linear whose output reaches the unit's
/// output only through ops whose backward does not read their input's value
/// (additions, dropout), e.g. a transformer block's last projection before
/// the residual add. During a checkpoint's recompute (is_recomputing()) it
/// computes no product: the output is zeros of the right shape and dtype, and
/// its backward does the Linear's gradient math (dx = g·W, dW = gᵀ·x,
/// db = Σg) from x and the weight. Why: backward reads nothing of that
/// output, so its GEMM (a third of a GPT block's forward FLOPs) was wasted
/// work; torch.compile's partitioner drops it from the recomputed graph the
/// same way. Under CPU/CUDA autocast it computes in the autocast dtype, as
/// torch::linear would. Elsewhere it is exactly torch::linear.
torch::Tensor linear_output_unread_in_recompute(const torch::Tensor& x, const torch::Tensor& weight,
                                                const torch::Tensor& bias);

/// The kinds of ops a selective policy keeps.
enum class KeptOp { attention, matmul };

/// One op of a unit, as selective checkpointing runs it (see policy above).
struct CheckpointedOp {
  KeptOp kind = KeptOp::matmul;
  /// The op as usual, differentiable. Runs outside checkpointed units, and
  /// inside them whenever the policy does not keep this op.
  std::function<torch::Tensor()> run;
  /// The op in a checkpointed unit's forward (no grad) when the policy keeps
  /// it: its output first, then whatever `replay` needs besides the inputs.
  /// The unit must not modify that output in place.
  std::function<std::vector<torch::Tensor>()> save;
  /// The op in the recompute, given what `save` returned: the same output
  /// with the op's backward attached (from the recomputed inputs), without
  /// computing it again.
  std::function<torch::Tensor(std::vector<torch::Tensor>)> replay;
};

/// Runs `op` under the policy of the checkpointed unit this thread is in
/// (run() outside one). The recompute must call the same kinds of ops in the
/// same order as the forward did (TORCH_CHECK otherwise).
torch::Tensor checkpointed_op(const CheckpointedOp& op);

/// torch::linear(x, weight, bias), kept by the "op" policy (every other
/// one); its replay does the Linear's gradient math from x and the weight,
/// computing no product. Under CPU/CUDA autocast it computes in the autocast
/// dtype, as torch::linear would.
torch::Tensor checkpointed_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

}  // namespace strata
