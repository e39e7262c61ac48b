#pragma once
// A sweep: the cross product presets × strategies × activation checkpointing ×
// offload × precision × world sizes × batch/block sizes, as one Suite for the
// harness (same generated data and seed for every case). Combinations that
// strata-gpt would refuse are kept as skipped cases with the reason, so the
// report shows what was not run and why.
//
//   SweepOptions o;
//   o.presets({preset_a, preset_b}).strategies({name_a, name_b}).ac({0, 1});
//   Suite s = make_sweep(o, strategies, models);   // s.cases: sweep/<preset_a>/<name_a>-2x1-b8-t64, ...
#include "strata/bench/harness.h"
#include "strata/recipes/models/spec.h"
#include "strata/strategies/registry.h"

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

namespace strata::bench {

/// Every axis of a sweep (each a list; the cases are their product).
struct SweepOptions {
  /// The registered families' presets; empty: their default (ModelRegistry::default_preset).
  TORCH_ARG(std::vector<std::string>, presets) = {};
  /// Registered strategy names; empty: the reference strategy alone.
  TORCH_ARG(std::vector<std::string>, strategies) = {};
  TORCH_ARG(std::vector<int64_t>, ac) = {0};  ///< --activation-checkpointing values (0 off, n every n-th)
  TORCH_ARG(std::vector<std::string>, offload) = {"none"};  ///< none, cpu, disk (fsdp only)
  TORCH_ARG(std::vector<std::string>, precision) = {"fp32"};
  TORCH_ARG(std::vector<int>, nproc) = {2};
  /// --pp-size values (1: no pipeline); the strategy runs over nproc / pp ranks.
  TORCH_ARG(std::vector<int>, pp) = {1};
  TORCH_ARG(std::string, pp_schedule) = "1f1b";
  /// --accumulate-grad-batches values: a pipeline's micro-batches.
  TORCH_ARG(std::vector<int64_t>, microbatches) = {1};
  TORCH_ARG(std::vector<int64_t>, batch_size) = {8};  ///< per rank
  TORCH_ARG(std::vector<int64_t>, block_size) = {64};
  TORCH_ARG(int64_t, steps) = 20;
  TORCH_ARG(int, threads_per_rank) = 1;
  TORCH_ARG(std::string, device) = "cpu";
};

/// Precisions a sweep accepts; its strategies and presets are the registries'.
std::vector<std::string> sweep_precisions();

/// Throws c10::ValueError naming the axis, the bad value and what is allowed
/// for an empty axis, an unknown name (a strategy `strategies` or a preset
/// `models` does not know), a non-positive size or a repeated value.
void validate(const SweepOptions& options, const StrategyRegistry& strategies, const recipes::ModelRegistry& models);

/// The sweep as a Suite named "sweep" (validates first). Case names are
/// "sweep/<preset>/<strategy>[-ac<n>][-offload-<where>][-bf16][-pp<P>][-m<M>]-<N>x<threads>-b<batch>-t<block>";
/// each case's reference is the fp32 case of the reference strategy of its
/// preset, world size and shape (else the first case run of that group). A
/// strategy given more ranks than it runs on (StrategySpec::max_world_size),
/// or a pipeline size that does not divide the world, is a skipped case.
Suite make_sweep(const SweepOptions& options, const StrategyRegistry& strategies, const recipes::ModelRegistry& models);

/// "a,b,c" -> {"a", "b", "c"}; throws c10::ValueError naming `what` for an
/// empty item.
std::vector<std::string> split_list(const std::string& csv, const std::string& what);
/// The same, each item an integer (c10::ValueError names the bad item).
std::vector<int64_t> split_int_list(const std::string& csv, const std::string& what);

}  // namespace strata::bench
