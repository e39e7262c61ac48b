#include "strata/strategies/tp/plan.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <fnmatch.h>

#include <sstream>

namespace strata::tp {

const char* style_name(Style style) {
  switch (style) {
    case Style::kColwise: return "colwise";
    case Style::kRowwise: return "rowwise";
    case Style::kVocab: return "vocab";
  }
  return "?";
}

namespace {

std::vector<std::string> segments(const std::string& path) {
  std::vector<std::string> out;
  std::stringstream in(path);
  for (std::string s; std::getline(in, s, '.');) out.push_back(s);
  return out;
}

}  // namespace

bool path_matches(const std::string& pattern, const std::string& path) {
  const auto want = segments(pattern), have = segments(path);
  if (want.size() != have.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    // A shell pattern within one segment: '*' never crosses a '.'.
    if (::fnmatch(want[i].c_str(), have[i].c_str(), 0) != 0) return false;
  }
  return true;
}

namespace {

/// "h3.attn.c_attn.weight" -> {"h3.attn.c_attn", "weight"}.
std::pair<std::string, std::string> module_and_leaf(const std::string& name) {
  const auto dot = name.rfind('.');
  if (dot == std::string::npos) return {"", name};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

}  // namespace

bool rule_matches(const Rule& rule, const std::string& name) {
  const auto [module, leaf] = module_and_leaf(name);
  return path_matches(rule.module, module) && (rule.param.empty() || rule.param == leaf);
}

std::optional<Layout> layout_of(const Plan& plan, const std::string& name, int64_t dims) {
  const auto [module, leaf] = module_and_leaf(name);
  const Rule* found = nullptr;
  for (const auto& rule : plan) {
    if (!rule_matches(rule, name)) continue;
    TORCH_CHECK_VALUE(found == nullptr, "tensor-parallel plan: parameter ", name, " matches both '", found->module,
                      "' and '", rule.module, "'");
    found = &rule;
  }
  if (found == nullptr) return std::nullopt;
  TORCH_CHECK_VALUE(found->chunks >= 1, "tensor-parallel plan: rule '", found->module, "' has ", found->chunks,
                    " chunks; must be >= 1");
  // A rule naming one parameter splits it as the style splits a weight.
  const bool weight = leaf == "weight" || !found->param.empty();
  TORCH_CHECK_VALUE(weight || leaf == "bias", "tensor-parallel plan: rule '", found->module, "' (",
                    style_name(found->style), ") names parameter ", name, "; a ", style_name(found->style),
                    " module holds a weight and maybe a bias");
  switch (found->style) {
    case Style::kColwise:
      // Output features: the weight's rows and the bias alike.
      return Layout{0, found->chunks};
    case Style::kRowwise:
      TORCH_CHECK_VALUE(!weight || dims == 2, "tensor-parallel plan: rowwise ", name, " has ", dims,
                        " dimensions; a Linear weight has 2");
      if (!weight) return std::nullopt;  // added once, after the sum over ranks
      return Layout{1, found->chunks};
    case Style::kVocab:
      TORCH_CHECK_VALUE(weight, "tensor-parallel plan: vocab rule '", found->module, "' names ", name,
                        "; an embedding holds a weight only");
      return Layout{0, 1};
  }
  return std::nullopt;
}

std::vector<int64_t> shard_shape(std::vector<int64_t> shape, const Layout& layout, int rank, int size) {
  TORCH_CHECK(layout.dim < static_cast<int64_t>(shape.size()), "tensor parallelism: dim ", layout.dim,
              " of a tensor of ", shape.size(), " dimensions");
  const int64_t total = shape[layout.dim];
  TORCH_CHECK_VALUE(total % layout.chunks == 0, "tensor parallelism: dimension ", layout.dim, " of size ", total,
                    " does not split into ", layout.chunks, " equal chunks");
  const auto [lo, hi] = split_range(total / layout.chunks, rank, size);
  shape[layout.dim] = (hi - lo) * layout.chunks;
  return shape;
}

torch::Tensor shard_of(const torch::Tensor& full, const Layout& layout, int rank, int size) {
  const int64_t block = full.size(layout.dim) / layout.chunks;
  const auto [lo, hi] = split_range(block, rank, size);
  std::vector<torch::Tensor> parts;
  for (int64_t c = 0; c < layout.chunks; ++c) parts.push_back(full.narrow(layout.dim, c * block + lo, hi - lo));
  return torch::cat(parts, layout.dim).contiguous();
}

torch::Tensor unshard(const std::vector<torch::Tensor>& parts, const Layout& layout) {
  const int size = static_cast<int>(parts.size());
  std::vector<torch::Tensor> pieces;
  for (int64_t c = 0; c < layout.chunks; ++c) {
    for (int r = 0; r < size; ++r) {
      const int64_t n = parts[r].size(layout.dim) / layout.chunks;
      pieces.push_back(parts[r].narrow(layout.dim, c * n, n));
    }
  }
  return torch::cat(pieces, layout.dim);
}

}  // namespace strata::tp
