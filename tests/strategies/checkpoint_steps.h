#pragma once
// Helpers the activation-checkpointing tests share: small models, one
// forward + backward from a fixed seed, gradient comparison, and a counter of
// the ops a step runs.
#include "strata/core/precision.h"
#include "strata/recipes/models/gpt/gpt.h"
#include "tests/mlp_stack.h"
#include "tests/toy_data.h"

#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <set>
#include <string>
#include <vector>

namespace strata::testing {

inline recipes::GPTModule make_gpt(double dropout, uint64_t seed = 0) {
  torch::manual_seed(seed);
  return recipes::GPTModule(recipes::gpt_preset("gpt-nano").vocab_size(16).block_size(8).dropout(dropout));
}

inline MlpStackModule make_mlp(double dropout, int64_t depth = 4, uint64_t seed = 0) {
  torch::manual_seed(seed);
  return MlpStackModule(16, 24, depth, dropout);
}

inline Batch toy_batch(int64_t batch_size = 4) { return ToyData().train_batch(0, batch_size, ShardInfo{}); }

/// One forward + backward from a fixed RNG seed.
struct StepResult {
  double loss = 0.0;
  std::vector<torch::Tensor> grads;
  torch::Tensor next_draw;  ///< the RNG stream right after backward
};

inline StepResult forward_backward(TrainingModule& module, const Batch& batch, uint64_t seed,
                                   Precision precision = Precision::kFp32) {
  module.module().train();
  torch::manual_seed(seed);
  torch::Tensor loss;
  {
    AutocastGuard autocast(precision);
    loss = module.training_step(batch);
  }
  loss.backward();
  StepResult out;
  out.loss = loss.item<double>();
  for (const auto& p : module.module().parameters()) {
    out.grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  }
  out.next_draw = torch::rand({8});
  return out;
}

/// Largest |a - b| over all gradients; infinity if one is missing on one side
/// only (frozen parameters have none on either).
inline double max_grad_diff(const StepResult& a, const StepResult& b) {
  EXPECT_EQ(a.grads.size(), b.grads.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.grads.size() && i < b.grads.size(); ++i) {
    if (!a.grads[i].defined() && !b.grads[i].defined()) continue;
    if (!a.grads[i].defined() || !b.grads[i].defined()) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, (a.grads[i] - b.grads[i]).abs().max().item<double>());
  }
  return worst;
}

/// Counts calls of the named ops (record-function names, e.g. aten::mm) on
/// any thread while it lives. One at a time.
class OpCounter {
 public:
  explicit OpCounter(std::set<std::string> names) {
    names_ = std::move(names);
    count_ = 0;
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&OpCounter::on_enter).scopes({at::RecordScope::FUNCTION}));
  }
  ~OpCounter() { at::removeCallback(handle_); }
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;
  int64_t count() const { return count_; }

 private:
  static std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
    if (names_.count(fn.name())) ++count_;
    return nullptr;
  }
  static inline std::set<std::string> names_;
  static inline std::atomic<int64_t> count_{0};
  at::CallbackHandle handle_;
};

/// How often one forward + backward (seed 42) of `module` calls the named ops.
inline int64_t ops_in_forward_backward(TrainingModule& module, const Batch& batch, std::set<std::string> names) {
  OpCounter ops(std::move(names));
  forward_backward(module, batch, 42);
  return ops.count();
}

inline int64_t gemms_in_forward_backward(TrainingModule& module, const Batch& batch) {
  return ops_in_forward_backward(module, batch, {"aten::addmm", "aten::mm"});
}

}  // namespace strata::testing
