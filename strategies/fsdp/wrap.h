#pragma once
// Which parameters form which FSDP unit (the wrap policy).
//
// `block`: every module of TrainingModule::wrap_units() is a unit (GPT: each
// transformer block, in forward order), and the root unit holds every
// trainable parameter in no unit (embeddings, final norm, head). A parameter
// reachable from two units (a tie across units) goes to the root, which stays
// gathered for the whole step. `none`: the root unit holds everything.
// A parameter registered under two names (a tied weight) is one parameter.
#include "strata/core/training_module.h"

#include <torch/torch.h>

#include <string>
#include <vector>

namespace strata {

enum class WrapPolicy { kBlock, kNone };

/// "block" or "none"; anything else is an error listing both.
WrapPolicy parse_wrap_policy(const std::string& name);
std::string to_string(WrapPolicy policy);

struct UnitAssignment {
  /// Per wrap unit, in wrap_units() order: indices into the parameter list
  /// given to assign_units(), in that list's order. May be empty.
  std::vector<std::vector<size_t>> units;
  /// Parameters in no unit, or in several.
  std::vector<size_t> root;
  /// A short name per unit: the common prefix of its parameters' names.
  std::vector<std::string> unit_names;
};

/// Assigns each of `params` (trainable, registration order, with `names`) to
/// exactly one unit or the root. A parameter listed twice (same tensor) is
/// assigned once, at its first position.
UnitAssignment assign_units(TrainingModule& module, const std::vector<torch::Tensor>& params,
                            const std::vector<std::string>& names, WrapPolicy policy);

}  // namespace strata
