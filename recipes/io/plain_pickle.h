#pragma once
// torch.save files without Python: writing one that torch.load reads with
// weights_only=True, and reading Python's (OrderedDict state_dicts) with
// LibTorch's unpickler. Used by recipes/models/gpt/interop.cpp.
#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace strata::recipes {

/// The key under which with_plain_dicts() stores an OrderedDict's BUILD state
/// (its `_metadata`) in the plain dict: readers skip it.
constexpr const char* kPickleStateKey = "__strata_pickle_state__";

/// torch::pickle_save's zip archive (torch.save's format), but with the
/// dict's types left untagged, so that torch.load's default
/// (weights_only=True since torch 2.6) accepts it.
std::vector<char> plain_pickle_save(const c10::IValue& value);

/// c10::ValueError naming `what` and the first global the pickle of `bytes`
/// (a torch.save zip archive's data.pkl, or a bare pickle) names beyond what
/// a dict of tensors needs ("posix.system"), or an opcode that could call
/// one without naming it (STACK_GLOBAL, INST, EXT*), or a pickle it cannot
/// walk. Made before LibTorch's unpickler sees the file: strata reads
/// tensors, numbers, strings, lists and dicts, and nothing it loads names
/// code to run.
void check_pickle_globals(const std::vector<char>& bytes, const std::string& what);

/// A torch.save zip archive whose pickle has every OrderedDict made a plain
/// dict (which torch::pickle_load reads); `bytes` unchanged when it is no zip
/// archive, holds no OrderedDict, or uses a pickle opcode this does not know.
std::vector<char> with_plain_dicts(const std::vector<char>& bytes);

}  // namespace strata::recipes
