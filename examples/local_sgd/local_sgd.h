#pragma once
// Local SGD with DiLoCo's outer step: a strategy written outside strata, the
// way a user writes one (strata/strategies/spec.h).
//
// Each rank steps alone (its own gradients, its own inner optimizer) for
// --sync-every steps. Then the parameters are averaged over the ranks, and
// either the average replaces them (--outer-optimizer average: plain local
// SGD) or, as DiLoCo does (Douillard et al., 2023; what torchft offers as
// low-communication training), the average change since the last
// synchronisation is a pseudo-gradient for an outer SGD with Nesterov
// momentum (--outer-lr 0.7, --outer-momentum 0.9: DiLoCo's).
//
// Communicated: the parameters once every K steps (ring all-reduce, 2(N-1)/N
// x 4 bytes per parameter): 1/K of ddp's bytes per step. Held besides ddp's
// model state: the last synchronised parameters and the outer momentum (4 + 4
// bytes per parameter).
//
// Limits: between synchronisations the ranks' weights differ, so a
// checkpoint (rank 0's view) or an export is one replica's unless the step is
// a multiple of K; the last synchronised copy and the outer momentum are not
// in checkpoints (a resume starts them afresh).
#include <strata/strategies/spec.h>
#include <strata/strategies/strategy.h>

#include <torch/torch.h>

#include <string>

namespace local_sgd {

struct LocalSGDOptions {
  TORCH_ARG(int64_t, sync_every) = 8;
  /// "nesterov" (DiLoCo's outer step) or "average" (plain local SGD).
  TORCH_ARG(std::string, outer_optimizer) = "nesterov";
  TORCH_ARG(double, outer_lr) = 0.7;
  TORCH_ARG(double, outer_momentum) = 0.9;
};

class LocalSGDStrategy : public strata::Strategy {
 public:
  LocalSGDStrategy(strata::Comm comm, LocalSGDOptions options);
  std::string name() const override { return "local-sgd"; }

  /// The base's setup, then every rank starts from rank 0's parameters.
  void setup(strata::TrainingModule& module) override;
  /// The inner step (the base's: this rank's optimizer on its own
  /// gradients), then every sync_every-th step the outer one.
  void optimizer_step(torch::optim::Optimizer& optimizer) override;
  std::string describe() const override;

 private:
  /// The outer step: average the parameters over the ranks (one all-reduce
  /// of one flat buffer), then apply it.
  void synchronize();

  LocalSGDOptions options_;
  int64_t steps_ = 0;
  torch::Tensor anchor_;    ///< flat: the parameters at the last synchronisation
  torch::Tensor momentum_;  ///< flat: the outer Nesterov momentum
};

/// How "local-sgd" registers: its options (--sync-every, --outer-optimizer,
/// --outer-lr, --outer-momentum), its memory and communication, how the
/// planner and strata-bench try it.
strata::StrategySpec local_sgd_spec();

}  // namespace local_sgd
