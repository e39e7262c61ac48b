#pragma once
// The tensor-parallel plan: which of a model's modules are split over the
// tensor-parallel ranks, and how (torchtitan's per-module plan,
// `parallelize_module(model, tp_mesh, {"layers.*.attention.wq": ColwiseParallel(), ...})`).
//
// A model opts in by implementing TensorParallelModel: it names its plan, and
// its forward calls the tp::Parallel it is given (parallel.h) at the plan's
// boundaries: column(), row(), embedding(). C++ modules have no forward
// hooks, so the model says where the collectives go; the plan says what each
// rank holds. TensorParallel (tensor_parallel.h) applies both.
//
// Styles (a module path matches a pattern segment by segment, each a shell
// pattern: "h*" matches h0, h11; '*' never crosses a '.'; a rule that matches
// no parameter is an error):
//   colwise   Linear split along its output features: weight rows and bias.
//             `chunks` > 1: a fused projection (QKV) whose output is that many
//             equal blocks, each split alike (rank r holds its heads of Q, K, V).
//   rowwise   Linear split along its input features: weight columns; the bias
//             stays whole (added once, after the sum over ranks).
//   vocab     Embedding split along its rows (the vocabulary); its output is
//             the sum over ranks, each contributing the tokens it holds.
// A split need not be even: rank r of T holds elements [r·n/T, (r+1)·n/T) of
// each block (a vocabulary of 65 over 2 ranks: 32 and 33 rows). Every
// parameter no rule names is replicated: the same on every rank.
//
// Example (the GPT's plan, recipes/models/gpt.cpp):
//   tp::Plan{{"wte", tp::Style::kVocab},
//            {"h*.attn.c_attn", tp::Style::kColwise, 3},
//            {"h*.attn.c_proj", tp::Style::kRowwise},
//            {"h*.c_fc", tp::Style::kColwise},
//            {"h*.c_proj", tp::Style::kRowwise}};
#include "strata/strategies/tp/parallel.h"

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace strata::tp {

enum class Style { kColwise, kRowwise, kVocab };

/// "colwise", "rowwise", "vocab".
const char* style_name(Style style);

struct Rule {
  Rule(std::string module, Style style, int64_t chunks = 1, std::string param = "")
      : module(std::move(module)), style(style), chunks(chunks), param(std::move(param)) {}

  std::string module;  ///< a module path pattern: "h*.attn.c_attn"
  Style style;
  int64_t chunks = 1;  ///< colwise: equal blocks of the output, each split alike
  /// Empty: the module's weight (and bias) as the style says. Else only this
  /// parameter of the module, split as the style splits a weight; its other
  /// parameters stay replicated. For a module that is not a Linear, such as a
  /// LoRA adapter beside a split Linear: {"h*.c_fc_lora", kColwise, 1, "B"}.
  std::string param;
};

using Plan = std::vector<Rule>;

/// How one parameter is split: along `dim`, each of `chunks` equal blocks of
/// that dimension split over the ranks (see the file comment).
struct Layout {
  int64_t dim = 0;
  int64_t chunks = 1;
};

/// Whether module path `path` ("h3.attn.c_attn") matches `pattern` ("h*.attn.c_attn").
bool path_matches(const std::string& pattern, const std::string& path);

/// Whether `rule` names parameter `name` ("h3.attn.c_attn.weight").
bool rule_matches(const Rule& rule, const std::string& name);

/// The layout of parameter `name` ("h3.attn.c_attn.weight") under `plan`, or
/// nullopt when it is replicated. Throws c10::ValueError when two rules name
/// its module, or a rule names a parameter the style cannot split.
std::optional<Layout> layout_of(const Plan& plan, const std::string& name, int64_t dims);

/// Rank `rank`'s part of `full` under `layout` (a new contiguous tensor).
torch::Tensor shard_of(const torch::Tensor& full, const Layout& layout, int rank, int size);

/// The local shape of a parameter of global `shape` on rank `rank`.
std::vector<int64_t> shard_shape(std::vector<int64_t> shape, const Layout& layout, int rank, int size);

/// Puts the ranks' parts together: `parts[r]` is rank r's shard_of(full).
torch::Tensor unshard(const std::vector<torch::Tensor>& parts, const Layout& layout);

/// A model that can be split over tensor-parallel ranks (see the file comment).
class TensorParallelModel {
 public:
  virtual ~TensorParallelModel() = default;
  /// What each rank holds.
  virtual Plan tensor_parallel_plan() const = 0;
  /// "" when the model splits over `size` ranks (heads divisible, ...), else
  /// why not, naming the values.
  virtual std::string tensor_parallel_problem(int size, bool sequence_parallel) const = 0;
  /// Called once the parameters are split: the forward calls `parallel` from now on.
  virtual void set_tensor_parallel(const Parallel& parallel) = 0;
};

}  // namespace strata::tp
