#pragma once
// TorchScriptModule: a language model defined and scripted in Python
// (torch.jit.script(model).save("model.pt")), trained by strata's Trainer
// under any strategy (strata-gpt --torchscript model.pt).
//
// The module contract (what the scripted model must provide):
//  - `forward(idx: Tensor) -> Tensor`: idx int64 [B, T] token ids, returns
//    logits [B, T, V] with V >= the data's vocabulary. strata computes the
//    loss itself, as for its GPT: cross-entropy over the last dimension,
//    targets of -1 ignored, mean over scored positions (so validation loss and
//    exact-match accuracy mean the same as for the GPT recipe).
//  - Optional, the unit protocol, which gives FSDP and activation
//    checkpointing real units: all three of
//      `embed(idx: Tensor) -> Tensor`   tokens -> hidden states x,
//      `blocks`                          an nn.ModuleList attribute whose
//                                        modules each have `forward(x) -> x`,
//      `head(x: Tensor) -> Tensor`       hidden states -> logits,
//    with forward(idx) == head(blocks[n-1](...blocks[0](embed(idx)))).
//    strata then runs embed, each block through the unit seam
//    (TrainingModule::run_unit), and head: the wrap units are the modules of
//    `blocks`, in order; every parameter elsewhere (embeddings, head, tied
//    weights) is the root's. Without the protocol (none of the three), the
//    model is called through forward and is one unit. Giving some but not all
//    of the three is an error. Blocks follow the unit seam's rules
//    (core/training_module.h): deterministic given the RNG state, no in-place
//    change of their input, no running statistics.
//  - Tensors the model creates in forward go on idx's device
//    (torch.arange(T, device=idx.device)) for --device cuda.
//  - Parameters are trained as they are (their values at save time are the
//    initialisation; every rank loads the same file); buffers follow the
//    module to the device; weight decay applies to parameters with >= 2 dims,
//    as for the GPT. Dropout follows train()/eval() (the Trainer's).
//
// How the strategies see it: a jit::Module is not a torch::nn::Module, so
// module() is an adapter, a tree of nn::Modules mirroring the scripted
// module's submodules whose parameters and buffers are the scripted module's
// own tensors (register_parameter shares the TensorImpl). Strategies move,
// shard and re-point them with set_data (to(device), FSDP's views of its flat
// buffers), which the scripted code sees, since it holds the same tensors.
// train()/eval() on the adapter also switch the scripted module.
#include "strata/core/training_module.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

namespace strata::recipes {

/// An nn::Module tree presenting a jit::Module's parameters and buffers (the
/// same tensors) under the same qualified names (a tensor held under two
/// names, e.g. tied weights, appears once, at its first); train(on) reaches
/// the scripted module.
class ScriptedModuleAdapter : public torch::nn::Module {
 public:
  explicit ScriptedModuleAdapter(torch::jit::Module module);
  void train(bool on = true) override;

 private:
  /// `seen`: TensorImpls registered anywhere in the tree so far.
  ScriptedModuleAdapter(torch::jit::Module module, const std::shared_ptr<std::unordered_set<const void*>>& seen);
  torch::jit::Module module_;
};

class TorchScriptModule : public TrainingModule {
 public:
  /// Loads `path` (torch.jit.save / torch.jit.script(...).save) onto the CPU;
  /// errors name the path and what is wrong (unreadable, no forward, a partial
  /// unit protocol).
  explicit TorchScriptModule(const std::string& path);

  torch::nn::Module& module() override { return *adapter_; }
  torch::Tensor training_step(const Batch& batch) override;
  ValidationStep validation_step(const Batch& batch) override;
  /// The modules of `blocks` (their adapters) under the unit protocol; none
  /// otherwise.
  std::vector<std::shared_ptr<torch::nn::Module>> wrap_units() override;
  /// 6 x parameters (the dense-model estimate; attention not counted).
  double flops_per_token() const override;

  /// Logits [B, T, V] for idx [B, T]: embed, each block through run_unit,
  /// head (unit protocol), or forward.
  torch::Tensor forward(const torch::Tensor& idx);
  /// True when the model follows the unit protocol.
  bool has_units() const { return !blocks_.empty(); }
  /// Parameters (counted at load).
  int64_t num_params() const { return num_params_; }
  /// Saves the scripted module (current parameter values) to
  /// `path` atomically; torch.jit.load (Python) and torch::jit::load (C++)
  /// read it. Call it with the full parameters present (Strategy::full_params).
  void save(const std::string& path);
  torch::jit::Module& scripted() { return scripted_; }

 private:
  std::string path_;
  torch::jit::Module scripted_;
  std::shared_ptr<ScriptedModuleAdapter> adapter_;
  std::vector<torch::jit::Module> blocks_;  // unit protocol: the scripted blocks
  std::vector<std::shared_ptr<torch::nn::Module>> block_adapters_;
  int64_t num_params_ = 0;
};

}  // namespace strata::recipes
