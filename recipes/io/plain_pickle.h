#pragma once
// torch.save files without Python: writing one that torch.load reads with
// weights_only=True, and reading Python's (OrderedDict state_dicts) with
// LibTorch's unpickler. Used by recipes/models/gpt/interop.cpp.
#include <ATen/core/ivalue.h>

#include <vector>

namespace strata::recipes {

/// The key under which with_plain_dicts() stores an OrderedDict's BUILD state
/// (its `_metadata`) in the plain dict: readers skip it.
constexpr const char* kPickleStateKey = "__strata_pickle_state__";

/// torch::pickle_save's zip archive (torch.save's format), but with the
/// dict's types left untagged, so that torch.load's default
/// (weights_only=True since torch 2.6) accepts it.
std::vector<char> plain_pickle_save(const c10::IValue& value);

/// A torch.save zip archive whose pickle has every OrderedDict made a plain
/// dict (which torch::pickle_load reads); `bytes` unchanged when it is no zip
/// archive, holds no OrderedDict, or uses a pickle opcode this does not know.
std::vector<char> with_plain_dicts(const std::vector<char>& bytes);

}  // namespace strata::recipes
