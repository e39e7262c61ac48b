#pragma once
// Deferred (meta-device) parameters: building a model without its memory.
//
// A model too big for one rank is built *deferred*: its parameters exist with
// their final shapes and dtypes, but on the meta device (no memory). A
// strategy then materialises them where they will live (the base Strategy:
// the whole module on its device; FSDP: one wrap unit at a time, straight
// into its flat buffer) and asks the TrainingModule to initialise them in
// place (TrainingModule::init_parameter). The parameters keep their identity
// throughout (the module's members, optimizer references and autograd hooks
// all see the same tensors), only their data changes.
//
// LibTorch 1.13's Tensor::set_data (and so Module::to) refuses to move a
// tensor between the meta device and a real one; replace_data() does what
// set_data does without that check.
#include "strata/core/training_module.h"

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>

namespace strata {

/// True when `t` holds no memory yet: a deferred parameter (meta device).
inline bool is_deferred(const torch::Tensor& t) { return t.defined() && t.is_meta(); }

/// The value of one-element `t` as a double; 0 for a meta tensor, which has
/// none. A dry run (strategies/fake_world.h) steps on meta tensors: there no
/// rank missed a gradient, no norm clips, and a loss reads 0.
inline double scalar_value(const torch::Tensor& t) { return t.is_meta() ? 0.0 : t.item<double>(); }

/// Like `param.set_data(data)` (param keeps its identity, autograd metadata,
/// hooks, version counter and requires_grad, and takes data's storage, shape
/// and device), also from or to the meta device. The dtypes must match.
/// Drops param's gradient and cached gradient accumulator when the device
/// changes, as set_data does.
void replace_data(const torch::Tensor& param, const torch::Tensor& data);

/// Moves every parameter of `module` (recursively) to the meta device, keeping
/// shapes and dtypes: its memory is freed. Buffers stay where they are.
void defer_parameters(torch::nn::Module& module);

/// True when any parameter of `module` is deferred.
bool has_deferred_parameters(torch::nn::Module& module);

/// Module::to(device) for a module that may hold deferred parameters: moves
/// every parameter and buffer that has memory, leaves deferred ones alone.
void move_materialized(torch::nn::Module& module, const torch::Device& device);

/// Gives every deferred parameter of `module` memory on `device` and
/// initialises it (TrainingModule::init_parameter), one parameter at a time:
/// the peak is the materialised model. A parameter registered under two names
/// is initialised once, under its first. `which` (optional): only the
/// parameters it accepts (qualified name, tensor).
void materialize_parameters(
    TrainingModule& module, const torch::Device& device,
    const std::function<bool(const std::string&, const torch::Tensor&)>& which = nullptr);

/// The seed of one parameter's own generator: a mix of `seed` and a stable
/// hash of its qualified `name`, so a parameter's initial values depend on
/// neither the order parameters are initialised in nor where they live.
uint64_t parameter_seed(uint64_t seed, const std::string& name);

/// A CPU generator seeded with parameter_seed(seed, name).
at::Generator parameter_generator(uint64_t seed, const std::string& name);

/// Fills `param` in place with N(mean, std) drawn from `generator` on the CPU
/// (copied over for other devices, so values do not depend on the device or
/// on whether `param` is a view of a larger buffer).
void normal_init(const torch::Tensor& param, double mean, double stddev, at::Generator generator);

}  // namespace strata
