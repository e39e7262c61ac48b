#include "strata/recipes/models/gpt/interop.h"

#include "strata/recipes/models/gpt/hf_gpt2.h"

#include "strata/core/atomic_file.h"
#include "strata/core/file_text.h"
#include "strata/recipes/io/plain_pickle.h"

#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

namespace strata::recipes {

namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

/// "h12.rest" -> (12, "rest"); false when `name` is not a block parameter.
bool split_block_name(const std::string& name, int64_t& index, std::string& rest) {
  if (name.size() < 3 || name[0] != 'h' || !std::isdigit(static_cast<unsigned char>(name[1]))) return false;
  size_t i = 1;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  if (i >= name.size() || name[i] != '.') return false;
  index = std::stoll(name.substr(1, i - 1));
  rest = name.substr(i + 1);
  return true;
}

/// Parameter names inside a block, strata's -> nanoGPT's.
const std::vector<std::pair<std::string, std::string>>& block_prefixes() {
  static const std::vector<std::pair<std::string, std::string>> table = {
      {"ln_1.", "ln_1."}, {"ln_2.", "ln_2."}, {"attn.c_attn.", "attn.c_attn."},
      {"attn.c_proj.", "attn.c_proj."}, {"c_fc.", "mlp.c_fc."}, {"c_proj.", "mlp.c_proj."}};
  return table;
}

const std::vector<std::pair<std::string, std::string>>& root_names() {
  static const std::vector<std::pair<std::string, std::string>> table = {
      {"wte.", "transformer.wte."}, {"wpe.", "transformer.wpe."}, {"ln_f.", "transformer.ln_f."},
      {"lm_head.", "lm_head."}};
  return table;
}

bool is_leaf(const std::string& s) { return s == "weight" || s == "bias"; }

std::string shape_of(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}


}  // namespace

std::string to_nanogpt_name(const std::string& name) {
  int64_t index = 0;
  std::string rest;
  if (split_block_name(name, index, rest)) {
    for (const auto& [ours, theirs] : block_prefixes()) {
      if (starts_with(rest, ours) && is_leaf(rest.substr(ours.size()))) {
        return "transformer.h." + std::to_string(index) + "." + theirs + rest.substr(ours.size());
      }
    }
  }
  for (const auto& [ours, theirs] : root_names()) {
    if (starts_with(name, ours) && is_leaf(name.substr(ours.size()))) return theirs + name.substr(ours.size());
  }
  TORCH_CHECK_VALUE(false, "'", name, "' is not a GPT parameter name (wte, wpe, hN.{ln_1,ln_2,attn.c_attn,",
                    "attn.c_proj,c_fc,c_proj}, ln_f, lm_head; .weight or .bias)");
}

std::string from_nanogpt_name(const std::string& name) {
  const std::string block = "transformer.h.";
  if (starts_with(name, block)) {
    size_t i = block.size();
    size_t digits = i;
    while (digits < name.size() && std::isdigit(static_cast<unsigned char>(name[digits]))) ++digits;
    if (digits == i || digits >= name.size() || name[digits] != '.') return "";
    const std::string index = name.substr(i, digits - i);
    const std::string rest = name.substr(digits + 1);
    for (const auto& [ours, theirs] : block_prefixes()) {
      if (starts_with(rest, theirs) && is_leaf(rest.substr(theirs.size()))) {
        return "h" + index + "." + ours + rest.substr(theirs.size());
      }
    }
    return "";
  }
  for (const auto& [ours, theirs] : root_names()) {
    if (starts_with(name, theirs) && is_leaf(name.substr(theirs.size()))) return ours + name.substr(theirs.size());
  }
  return "";
}

NamedTensors to_nanogpt(const NamedTensors& by_strata_name, const GPTOptions& options) {
  NamedTensors out;
  for (const auto& [name, tensor] : by_strata_name) {
    TORCH_CHECK_VALUE(tensor.defined() && !tensor.is_meta(), "parameter ", name,
                      " holds no values (deferred or undefined): export needs the full parameters");
    out[to_nanogpt_name(name)] = tensor.detach().to(torch::kCPU, torch::kFloat32).contiguous().clone();
  }
  if (options.tie_weights()) {
    auto wte = out.find("transformer.wte.weight");
    TORCH_CHECK_VALUE(wte != out.end(), "tied weights need wte.weight among the parameters");
    TORCH_CHECK_VALUE(out.count("lm_head.weight") == 0,
                      "the options tie lm_head to wte, but the parameters hold a separate lm_head.weight");
    out["lm_head.weight"] = wte->second;  // nanoGPT's state_dict lists the tied tensor under both names
  }
  return out;
}

void write_weights(const std::string& path, const NamedTensors& by_strata_name, const GPTOptions& options) {
  const NamedTensors named = to_nanogpt(by_strata_name, options);
  // nanoGPT's state_dict order (embeddings, blocks by index, ln_f, lm_head)
  // rather than the map's alphabetical one, for a reader that prints it.
  auto rank_of = [](const std::string& name) -> std::pair<int64_t, std::string> {
    if (starts_with(name, "transformer.wte.")) return {-3, name};
    if (starts_with(name, "transformer.wpe.")) return {-2, name};
    if (starts_with(name, "transformer.h.")) {
      return {std::stoll(name.substr(14, name.find('.', 14) - 14)), name};
    }
    if (starts_with(name, "transformer.ln_f.")) return {1LL << 40, name};
    return {1LL << 41, name};
  };
  std::vector<std::string> order;
  for (const auto& item : named) order.push_back(item.first);
  std::stable_sort(order.begin(), order.end(),
                   [&](const std::string& a, const std::string& b) { return rank_of(a).first < rank_of(b).first; });
  c10::Dict<std::string, torch::Tensor> dict;
  for (const auto& name : order) dict.insert(name, named.at(name));
  const std::vector<char> bytes = plain_pickle_save(c10::IValue(dict));
  write_file_atomically(path, [&bytes](std::ostream& out) {
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  });
}

NamedTensors read_weights(const std::string& path) {
  if (is_hf_gpt2(path)) return read_hf_gpt2(path);  // transformers' safetensors (recipes/models/gpt/hf_gpt2.h)
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK_VALUE(in, "cannot read weights file '", path, "': ", std::strerror(errno));
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Before LibTorch's unpickler: a file from elsewhere names no code to run.
  check_pickle_globals(bytes, "weights file '" + path + "'");
  c10::IValue value;
  try {
    value = torch::pickle_load(with_plain_dicts(bytes));
  } catch (const c10::Error& e) {
    // LibTorch's message can span lines and quote the file's bytes (found by
    // fuzzing): its first line, control bytes escaped.
    const std::string full = e.what_without_backtrace();
    TORCH_CHECK_VALUE(false, "weights file '", path, "' is not a torch.save / pickle_save file: ",
                      control_escaped(std::string_view(full).substr(0, full.find('\n'))));
  }
  TORCH_CHECK_VALUE(value.isGenericDict(), "weights file '", path, "' holds a ", value.tagKind(),
                    ", not a dict of tensors (name -> tensor)");
  auto dict = value.toGenericDict();
  // A nanoGPT checkpoint: {"model": state_dict, "optimizer": ..., ...}.
  if (dict.contains(c10::IValue("model")) && dict.at(c10::IValue("model")).isGenericDict()) {
    dict = dict.at(c10::IValue("model")).toGenericDict();
  }
  NamedTensors out;
  for (const auto& item : dict) {
    if (item.key().isString() && item.key().toStringRef() == kPickleStateKey) continue;  // OrderedDict's _metadata
    TORCH_CHECK_VALUE(item.key().isString() && item.value().isTensor(), "weights file '", path,
                      "' is not a dict of tensors: entry ", item.key(), " holds a ", item.value().tagKind());
    std::string name = item.key().toStringRef();
    if (starts_with(name, "_orig_mod.")) name = name.substr(10);  // saved from a torch.compile'd model
    out[name] = item.value().toTensor();
  }
  return out;
}

NamedTensors from_nanogpt(const NamedTensors& by_nanogpt_name, torch::nn::Module& model,
                          const GPTOptions& options, const std::string& source) {
  const NamedTensors params = named_parameters_of(model);
  std::vector<std::string> problems;
  NamedTensors out;
  std::vector<std::string> unexpected;
  for (const auto& [name, tensor] : by_nanogpt_name) {
    const std::string ours = from_nanogpt_name(name);
    const bool mask_buffer = ours.empty() && starts_with(name, "transformer.h.") &&
                             name.size() > 10 && name.compare(name.size() - 10, 10, ".attn.bias") == 0;
    if (mask_buffer) continue;  // nanoGPT's causal mask (no flash attention), not a parameter
    if (options.tie_weights() && name == "lm_head.weight") {
      auto wte = by_nanogpt_name.find("transformer.wte.weight");
      if (wte != by_nanogpt_name.end() &&
          (wte->second.sizes() != tensor.sizes() || !wte->second.to(torch::kFloat32).equal(tensor.to(torch::kFloat32)))) {
        problems.push_back("lm_head.weight differs from transformer.wte.weight, but the model ties them");
      }
      continue;
    }
    auto it = ours.empty() ? params.end() : params.find(ours);
    if (it == params.end()) {
      unexpected.push_back(name);
      continue;
    }
    if (it->second.sizes() != tensor.sizes()) {
      problems.push_back("shape of " + name + ": file " + shape_of(tensor) + " vs model " + shape_of(it->second));
      continue;
    }
    out[ours] = tensor;
  }
  std::vector<std::string> missing;
  for (const auto& [ours, param] : params) {
    // LoRA adapters start from their own init on top of the file's base
    // weights (a file from a LoRA run holds them merged).
    if (is_lora_parameter(ours)) continue;
    const std::string theirs = to_nanogpt_name(ours);
    if (by_nanogpt_name.count(theirs) == 0) missing.push_back(theirs);
  }
  if (!missing.empty()) problems.insert(problems.begin(), "missing: " + c10::Join(", ", missing));
  if (!unexpected.empty()) problems.push_back("unexpected: " + c10::Join(", ", unexpected));
  TORCH_CHECK_VALUE(problems.empty(), "weights in '", source, "' do not fit the model (", problems.size(),
                    " problem(s)): ", c10::Join("; ", problems));
  return out;
}

NamedTensors named_parameters_of(torch::nn::Module& module) {
  NamedTensors out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) out[item.key()] = item.value();
  return out;
}

}  // namespace strata::recipes
