#pragma once
// Runs one rank's share of a pipeline schedule (schedule.h) for one step:
// its stages' forwards and backwards over the step's micro-batches, the
// activations and input gradients sent between ranks over a Comm's
// point-to-point ops, on one communicator per lane (PipelineLanes below).
//
// The step's loss is the mean over micro-batches, as the trainer's gradient
// accumulation makes it: the last stage's backward starts from 1/M, so the
// parameters' gradients equal one process's on the whole batch.
//
// Example (each rank of a pp world):
//   auto schedule = strata::pp::make_schedule("1f1b", ScheduleOptions().ranks(P).microbatches(M));
//   strata::pp::StepInputs in{inputs, targets};          // M each; used by the first and last stage
//   auto losses = strata::pp::run_pipeline_step(*schedule, my_stages, in, comm,
//                                               ExecutorOptions().activation_shape({mb, T, C}));
#include "strata/strategies/comm.h"
#include "strata/strategies/pp/schedule.h"

#include <torch/torch.h>

#include <functional>
#include <map>
#include <vector>

namespace strata::pp {

/// One stage of a model, as the rank holding it runs it.
class Stage {
 public:
  virtual ~Stage() = default;
  /// The stage's output for `input`: the first stage gets the micro-batch's
  /// input, the others the previous stage's output; the last returns the
  /// micro-batch's loss against `target` (a scalar), the others their
  /// activation (of ExecutorOptions::activation_shape).
  virtual torch::Tensor forward(const torch::Tensor& input, const torch::Tensor& target) = 0;
  /// The parameters whose gradients the stage's backward accumulates.
  virtual std::vector<torch::Tensor> parameters() = 0;
};

struct ExecutorOptions {
  /// The activation every stage but the last sends (and its gradient, back).
  TORCH_ARG(std::vector<int64_t>, activation_shape);
  /// The type activations and their gradients travel in (each stage's
  /// output is cast to it: under autocast a stage may end in half precision).
  TORCH_ARG(torch::Dtype, dtype) = torch::kFloat32;
  /// The gradients are of the mean loss times this (fp16 loss scaling).
  TORCH_ARG(double, loss_scale) = 1.0;
  /// Called with each micro-batch's loss on the last stage, before its
  /// backward (the Trainer's on_before_backward callbacks).
  TORCH_ARG(std::function<void(const torch::Tensor&)>, on_loss);
  /// Called once per micro-batch on every rank, when this rank's share of
  /// its backward is done (its first held stage's B or W: the Trainer's
  /// on_after_backward callbacks).
  TORCH_ARG(std::function<void()>, on_backward_done);
};

/// Seconds of one rank's step: its forwards (F), whole backwards (B), input
/// and weight gradients (I, W), waiting for what it receives, and the whole
/// step (its actions and the wait for its sends at the end). The rest of
/// `total` than the compute is the rank's idle time: its bubble.
struct StepSeconds {
  double forward = 0.0, backward = 0.0, input = 0.0, weight = 0.0, waiting = 0.0, total = 0.0;
  double compute() const { return forward + backward + input + weight; }
  /// The share of the step this rank computed nothing (0 when nothing ran).
  double idle_share() const { return total > 0 ? 1.0 - compute() / total : 0.0; }
  StepSeconds& operator+=(const StepSeconds& o);
};

struct StepInputs {
  std::vector<torch::Tensor> inputs, targets;  ///< per micro-batch
};

/// The communicators a pipeline's messages travel on, one per Lane
/// (schedule.h): NCCL runs the point-to-point operations between two ranks
/// on one communicator in the order posted, and a send waits for its
/// receive, so activations and gradients, up and down, each get their own,
/// on which every schedule posts both ends in the same order
/// (lane_order_problem). Gloo pairs messages by tag in any order: one
/// communicator for all lanes runs the same there.
class PipelineLanes {
 public:
  /// Four communicators over `pp`'s ranks, named "<pp's name>-act-up" and
  /// so on (collective over `pp`: every rank splits alike).
  static PipelineLanes split(const Comm& pp);
  /// `one` for every lane.
  explicit PipelineLanes(const Comm& one);
  Comm& operator[](Lane lane) { return lanes_[size_t(lane)]; }
  /// The lane of this rank's send or receive `transfer`.
  Comm& of(const Action& transfer);

 private:
  explicit PipelineLanes(std::vector<Comm> lanes) : lanes_(std::move(lanes)) {}
  std::vector<Comm> lanes_;
};

/// Runs `rank`'s actions of `schedule` (this Comm's rank) with `stages` (the
/// global stage index -> the stage, every stage this rank holds). Gradients
/// accumulate into the stages' parameters. Returns the losses of the
/// micro-batches when this rank holds the last stage, else empty.
/// c10::ValueError for a stage missing or held by another rank.
/// `seconds`, when given, gets this step's split added.
std::vector<double> run_pipeline_step(const Schedule& schedule, const std::map<int, Stage*>& stages,
                                      const StepInputs& in, PipelineLanes& lanes, const ExecutorOptions& options,
                                      StepSeconds* seconds = nullptr);
/// The same over one communicator (PipelineLanes(comm)): for Gloo.
std::vector<double> run_pipeline_step(const Schedule& schedule, const std::map<int, Stage*>& stages,
                                      const StepInputs& in, Comm& comm, const ExecutorOptions& options,
                                      StepSeconds* seconds = nullptr);

/// A weight two stages share (tied embeddings: the first stage's lookup, the
/// last stage's head), one copy on each of their ranks: after the step each
/// rank's gradient becomes the sum of both (a send and a receive between
/// `first_rank` and `last_rank`; nothing when they are one rank or this rank
/// is neither), so both copies take the same optimizer step.
void exchange_tied_gradient(const torch::Tensor& weight, int first_rank, int last_rank, Comm& comm);

/// `mine` to group rank `peer` and the peer's tensor of the same shape and
/// dtype back (both post their send before either waits: neither blocks; on
/// the gradient lanes, one direction each, so neither send waits behind the
/// other's on NCCL).
torch::Tensor swap_with_peer(const torch::Tensor& mine, int peer, PipelineLanes& lanes);
torch::Tensor swap_with_peer(const torch::Tensor& mine, int peer, Comm& comm);

}  // namespace strata::pp
