#include "strata/recipes/models/torchscript/torchscript.h"

#include "strata/core/atomic_file.h"
#include "strata/recipes/models/gpt/gpt.h"

#include <unordered_set>
#include <utility>

namespace strata::recipes {

ScriptedModuleAdapter::ScriptedModuleAdapter(torch::jit::Module module)
    : ScriptedModuleAdapter(std::move(module), std::make_shared<std::unordered_set<const void*>>()) {}

ScriptedModuleAdapter::ScriptedModuleAdapter(torch::jit::Module module,
                                             const std::shared_ptr<std::unordered_set<const void*>>& seen)
    : torch::nn::Module("ScriptedModule"), module_(std::move(module)) {
  // The scripted module's own tensors: register_parameter / register_buffer
  // keep the TensorImpl, so set_data (device moves, FSDP's views) on one is
  // seen by the other. A tensor the scripted module holds under two names
  // (tied weights) is registered once, at its first name: optimizers and
  // strategies must see each parameter once (Python's parameters() does the
  // same); the scripted code reads it under both names anyway.
  for (const auto& p : module_.named_parameters(/*recurse=*/false)) {
    if (seen->insert(p.value.unsafeGetTensorImpl()).second) {
      register_parameter(p.name, p.value, p.value.requires_grad());
    }
  }
  for (const auto& b : module_.named_buffers(/*recurse=*/false)) {
    if (seen->insert(b.value.unsafeGetTensorImpl()).second) register_buffer(b.name, b.value);
  }
  for (const auto& child : module_.named_children()) {
    register_module(child.name, std::shared_ptr<ScriptedModuleAdapter>(new ScriptedModuleAdapter(child.value, seen)));
  }
  torch::nn::Module::train(module_.is_training());
}

void ScriptedModuleAdapter::train(bool on) {
  torch::nn::Module::train(on);  // recurses into the child adapters
  module_.train(on);             // the scripted module's `training` flags (dropout)
}

namespace {
bool has_method(const torch::jit::Module& m, const std::string& name) { return m.find_method(name).has_value(); }
}  // namespace

TorchScriptModule::TorchScriptModule(const std::string& path) : path_(path) {
  try {
    scripted_ = torch::jit::load(path, torch::kCPU);
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false, "cannot load TorchScript model '", path, "' (torch.jit.save output expected): ",
                      e.what_without_backtrace());
  }
  TORCH_CHECK_VALUE(has_method(scripted_, "forward"), "TorchScript model '", path,
                    "' has no forward(idx) method");
  const bool embed = has_method(scripted_, "embed");
  const bool head = has_method(scripted_, "head");
  const bool blocks = scripted_.hasattr("blocks") && scripted_.attr("blocks").isModule();
  TORCH_CHECK_VALUE(embed == head && head == blocks, "TorchScript model '", path,
                    "' follows the unit protocol only in part: it needs all of embed(idx), a `blocks` "
                    "ModuleList and head(x), or none (has embed: ", embed, ", blocks: ", blocks, ", head: ", head, ")");
  adapter_ = std::make_shared<ScriptedModuleAdapter>(scripted_);
  if (blocks) {
    auto list = scripted_.attr("blocks").toModule();
    auto list_adapter = adapter_->named_children()["blocks"];
    for (const auto& child : list.named_children()) {
      TORCH_CHECK_VALUE(has_method(child.value, "forward"), "TorchScript model '", path, "': blocks.", child.name,
                        " has no forward(x) method");
      blocks_.push_back(child.value);
      block_adapters_.push_back(list_adapter->named_children()[child.name]);
    }
    TORCH_CHECK_VALUE(!blocks_.empty(), "TorchScript model '", path, "': `blocks` is empty");
  }
  for (const auto& p : adapter_->parameters()) num_params_ += p.numel();
}

torch::Tensor TorchScriptModule::forward(const torch::Tensor& idx) {
  if (blocks_.empty()) return scripted_.forward({idx}).toTensor();
  auto x = scripted_.run_method("embed", idx).toTensor();
  for (size_t i = 0; i < blocks_.size(); ++i) {
    // The block by value (a jit::Module is a handle): a runner may keep this
    // forward and call it again during backward (activation checkpointing).
    x = run_unit(static_cast<int64_t>(i), x, [block = blocks_[i]](const torch::Tensor& t) mutable {
      return block.forward({t}).toTensor();
    });
  }
  return scripted_.run_method("head", x).toTensor();
}

torch::Tensor TorchScriptModule::training_step(const Batch& batch) {
  return lm_loss(forward(batch.input), batch.target);
}

ValidationStep TorchScriptModule::validation_step(const Batch& batch) {
  return lm_validation(forward(batch.input), batch);
}

std::vector<std::shared_ptr<torch::nn::Module>> TorchScriptModule::wrap_units() { return block_adapters_; }

double TorchScriptModule::flops_per_token() const { return 6.0 * static_cast<double>(num_params_); }

void TorchScriptModule::save(const std::string& path) {
  // Compact copies while saving: under FSDP the parameters are views of a
  // unit's flat buffer, which serialization would write whole; the originals
  // are restored afterwards. (Tensors keep their device: torch.jit.load's
  // map_location moves them.)
  std::vector<std::pair<torch::Tensor, torch::Tensor>> saved;
  for (const auto& p : adapter_->parameters()) {
    saved.emplace_back(p, p.data());
    torch::NoGradGuard no_grad;
    p.set_data(p.detach().clone());
  }
  for (const auto& b : adapter_->buffers()) {
    saved.emplace_back(b, b.data());
    b.set_data(b.detach().clone());
  }
  auto restore = [&saved] {
    for (auto& [tensor, data] : saved) tensor.set_data(data);
  };
  try {
    write_file_atomically(path, [this](std::ostream& out) { scripted_.save(out); });
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

}  // namespace strata::recipes
