#include "strata/strategies/tp/tensor_parallel.h"

#include "strata/core/deferred_init.h"
#include "strata/strategies/piece_names.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>

namespace strata::tp {

TensorParallel::TensorParallel(Comm world, Comm group, TensorParallelOptions options)
    : world_(std::move(world)), group_(std::move(group)), options_(options) {
  TORCH_CHECK_VALUE(group_.size() >= 1 && world_.size() % group_.size() == 0, "tensor-parallel group of ",
                    group_.size(), " ranks does not divide the world of ", world_.size());
}

void TensorParallel::apply(TrainingModule& module) {
  auto* model = dynamic_cast<TensorParallelModel*>(&module);
  TORCH_CHECK_VALUE(model != nullptr, "tensor parallelism needs a model that implements tp::TensorParallelModel "
                    "(strata/strategies/tp/plan.h): its plan and a forward that calls tp::Parallel");
  const int size = group_.size(), rank = group_.rank();
  const std::string problem = model->tensor_parallel_problem(size, options_.sequence_parallel());
  TORCH_CHECK_VALUE(problem.empty(), problem);
  const Plan plan = model->tensor_parallel_plan();
  torch::NoGradGuard no_grad;
  layouts_.clear();
  shapes_.clear();
  replicated_params_ = 0;
  for (const auto& item : module.module().named_parameters(/*recurse=*/true)) {
    const torch::Tensor& p = item.value();
    const auto layout = layout_of(plan, item.key(), p.dim());
    if (!layout) {
      replicated_params_ += p.numel();
      continue;
    }
    torch::Tensor full = p;
    if (is_deferred(p)) {
      // Whole, initialised as an unsplit build would be, then cut: a part's
      // values must not depend on the tensor-parallel size.
      full = torch::empty(p.sizes(), p.options().device(group_.device()));
      module.init_parameter(item.key(), full);
    }
    shapes_[item.key()] = p.sizes().vec();
    layouts_[item.key()] = *layout;
    replace_data(p, shard_of(full.to(group_.device()), *layout, rank, size));
  }
  // A rule that splits nothing is a typo in the plan, not a choice.
  for (const auto& rule : plan) {
    bool used = false;
    for (const auto& [name, layout] : layouts_) used = used || rule_matches(rule, name);
    TORCH_CHECK_VALUE(used, "tensor-parallel plan: rule '", rule.module, "' (", style_name(rule.style),
                      ") matches no parameter of the model");
  }
  model->set_tensor_parallel(Parallel(group_, options_.sequence_parallel()));
}

bool TensorParallel::counts_gradient(const std::string& name) const {
  return layouts_.count(name) > 0 || group_.rank() == 0;
}

void TensorParallel::sum_over_group(torch::Tensor& sq) {
  // Sync point: each rank of the group holds other parts of the split
  // gradients; the norm is of the whole model.
  group_.all_reduce(sq);
}

torch::Tensor TensorParallel::gather(const std::string& name, const torch::Tensor& local) {
  const Layout& layout = layouts_.at(name);
  const int size = group_.size();
  const auto& shape = shapes_.at(name);
  // Parts may differ by a row (uneven splits): each is padded to the largest
  // along the split dimension, gathered flat, then cut back.
  int64_t widest = 0;
  for (int r = 0; r < size; ++r) widest = std::max(widest, shard_shape(shape, layout, r, size)[layout.dim]);
  auto padded_shape = local.sizes().vec();
  padded_shape[layout.dim] = widest;
  auto padded = torch::zeros(padded_shape, local.options());
  padded.narrow(layout.dim, 0, local.size(layout.dim)).copy_(local);
  auto all = torch::empty({size * padded.numel()}, local.options());
  // Sync point: every rank needs every part to rebuild the whole.
  group_.all_gather_into(all, padded.reshape({-1}));
  std::vector<torch::Tensor> parts;
  for (int r = 0; r < size; ++r) {
    const auto mine = shard_shape(shape, layout, r, size);
    parts.push_back(all.narrow(0, r * padded.numel(), padded.numel())
                        .view(padded_shape)
                        .narrow(layout.dim, 0, mine[layout.dim]));
  }
  return unshard(parts, layout);
}

std::shared_ptr<void> TensorParallel::gather_full_params(TrainingModule& module, bool writeback) {
  struct Swapped {
    torch::Tensor param, local;  // `local`: the part's own storage (maybe a view of a strategy's buffer)
    std::string name;
  };
  auto swapped = std::make_shared<std::vector<Swapped>>();
  torch::NoGradGuard no_grad;
  for (const auto& item : module.module().named_parameters(/*recurse=*/true)) {
    if (!layouts_.count(item.key())) continue;
    const torch::Tensor local = item.value().detach();
    replace_data(item.value(), gather(item.key(), local));
    swapped->push_back({item.value(), local, item.key()});
  }
  const int rank = group_.rank(), size = group_.size();
  // The parts come back, in their own storage, when the handle dies (with
  // `writeback`, cut from the whole first).
  return std::shared_ptr<void>(swapped.get(), [this, swapped, writeback, rank, size](void*) {
    torch::NoGradGuard guard;
    for (auto& s : *swapped) {
      if (writeback) s.local.copy_(shard_of(s.param.detach(), layouts_.at(s.name), rank, size));
      replace_data(s.param, s.local);
    }
  });
}

std::vector<StatePiece> TensorParallel::to_global(std::vector<StatePiece> pieces, StateUse use) const {
  const int rank = group_.rank(), size = group_.size();
  std::vector<StatePiece> out;
  for (auto& piece : pieces) {
    const auto it = layouts_.find(param_of_piece(piece.name));
    const bool split = it != layouts_.end() && !piece.shape.empty();  // a step count is one number
    if (!split) {
      // The same on every rank of the group: one of them saves it.
      if (use == StateUse::kLoad || rank == 0) out.push_back(std::move(piece));
      continue;
    }
    const Layout& layout = it->second;
    const auto& whole = shapes_.at(it->first);
    const auto local = shard_shape(whole, layout, rank, size);
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < layout.dim; ++d) outer *= whole[d];
    for (size_t d = layout.dim + 1; d < whole.size(); ++d) inner *= whole[d];
    const int64_t block = whole[layout.dim] / layout.chunks;
    const int64_t rows = local[layout.dim] / layout.chunks;  // this rank's rows of each chunk
    const int64_t first = split_range(block, rank, size).first;
    const int64_t lo = piece.lo, hi = piece.lo + piece.size();
    // Run (o, k): this rank's rows of chunk k within outer index o.
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t k = 0; k < layout.chunks; ++k) {
        const int64_t local_start = (o * local[layout.dim] + k * rows) * inner;
        const int64_t global_start = (o * whole[layout.dim] + k * block + first) * inner;
        const int64_t a = std::max(lo, local_start), b = std::min(hi, local_start + rows * inner);
        if (a >= b) continue;
        StatePiece run = piece;
        run.shape = whole;
        run.lo = global_start + (a - local_start);
        if (piece.streamed()) {
          // Offloaded (a disk tier): the run reads and writes its window of the piece.
          const int64_t skip = a - lo;
          run.numel = b - a;
          run.read = [read = piece.read, skip](int64_t at, const torch::Tensor& dst) { read(skip + at, dst); };
          run.write = [write = piece.write, skip](int64_t at, const torch::Tensor& src) { write(skip + at, src); };
        } else {
          run.values = piece.values.narrow(0, a - lo, b - a);
        }
        out.push_back(std::move(run));
      }
    }
  }
  return out;
}

std::string TensorParallel::describe() const {
  int64_t split = 0;
  for (const auto& [name, shape] : shapes_) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    split += n;
  }
  return c10::str("tensor parallel: group of ", group_.size(), " (", group_.group_name(), "), sequence parallel ",
                  options_.sequence_parallel() ? "on" : "off", "; ", layouts_.size(), " parameters split (", split,
                  " elements, 1/", group_.size(), " each), ", replicated_params_, " elements replicated");
}

}  // namespace strata::tp
