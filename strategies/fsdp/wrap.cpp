#include "strata/strategies/fsdp/wrap.h"

#include <unordered_map>
#include <unordered_set>

namespace strata {

WrapPolicy parse_wrap_policy(const std::string& name) {
  if (name == "block") return WrapPolicy::kBlock;
  if (name == "none") return WrapPolicy::kNone;
  TORCH_CHECK_VALUE(false, "unknown FSDP wrap policy '", name,
                    "'; available: block (each wrap unit, e.g. transformer block, plus the root), "
                    "none (the whole model is one unit)");
}

std::string to_string(WrapPolicy policy) { return policy == WrapPolicy::kBlock ? "block" : "none"; }

namespace {
std::string common_prefix(const std::vector<std::string>& names) {
  if (names.empty()) return "";
  std::string prefix = names.front();
  for (const auto& n : names) {
    size_t i = 0;
    while (i < prefix.size() && i < n.size() && prefix[i] == n[i]) ++i;
    prefix.resize(i);
  }
  // Cut back to a whole module path ("h1.attn.c_" -> "h1.attn", "h0." -> "h0").
  const auto dot = prefix.rfind('.');
  return dot == std::string::npos ? prefix : prefix.substr(0, dot);
}
}  // namespace

UnitAssignment assign_units(TrainingModule& module, const std::vector<torch::Tensor>& params,
                            const std::vector<std::string>& names, WrapPolicy policy) {
  const auto wrap_units = policy == WrapPolicy::kBlock ? module.wrap_units()
                                                       : std::vector<std::shared_ptr<torch::nn::Module>>{};
  // Which units reach each parameter (by tensor identity).
  std::unordered_map<const void*, std::vector<size_t>> units_of;
  for (size_t u = 0; u < wrap_units.size(); ++u) {
    TORCH_CHECK(wrap_units[u] != nullptr, "assign_units: wrap unit ", u, " is null");
    std::unordered_set<const void*> seen;
    for (const auto& p : wrap_units[u]->parameters(/*recurse=*/true)) {
      if (seen.insert(p.unsafeGetTensorImpl()).second) units_of[p.unsafeGetTensorImpl()].push_back(u);
    }
  }
  UnitAssignment out;
  out.units.resize(wrap_units.size());
  std::unordered_set<const void*> assigned;
  for (size_t k = 0; k < params.size(); ++k) {
    const void* impl = params[k].unsafeGetTensorImpl();
    if (!assigned.insert(impl).second) continue;  // the same tensor under a second name
    auto it = units_of.find(impl);
    if (it != units_of.end() && it->second.size() == 1) {
      out.units[it->second.front()].push_back(k);
    } else {
      out.root.push_back(k);  // in no unit, or shared by several: gathered all step long
    }
  }
  for (const auto& unit : out.units) {
    std::vector<std::string> unit_param_names;
    for (size_t k : unit) unit_param_names.push_back(names[k]);
    out.unit_names.push_back(common_prefix(unit_param_names));
  }
  return out;
}

}  // namespace strata
