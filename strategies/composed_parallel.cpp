// ComposedParallel (composed_parallel.h).
#include "strata/strategies/composed_parallel.h"

#include <c10/util/Exception.h>

namespace strata {

ComposedParallel::ComposedParallel(std::vector<std::shared_ptr<ModelParallel>> dims) : dims_(std::move(dims)) {
  TORCH_CHECK_VALUE(!dims_.empty(), "ComposedParallel of no dimension");
  for (const auto& d : dims_) TORCH_CHECK_VALUE(d != nullptr, "ComposedParallel: a dimension is null");
  // An inner dimension may have been made within an outer one's group (the
  // tensor-parallel ranks inside a stage's): it cannot span more ranks.
  for (const auto& d : dims_) {
    TORCH_CHECK_VALUE(world().size() % d->world().size() == 0, "ComposedParallel: a dimension over ",
                      d->world().size(), " ranks inside a world of ", world().size());
  }
}

bool ComposedParallel::counts_gradient(const std::string& name) const {
  for (const auto& d : dims_) {
    if (!d->counts_gradient(name)) return false;
  }
  return true;
}

void ComposedParallel::sum_over_group(torch::Tensor& sq) {
  // Sync point, per dimension: the groups are orthogonal, so summing over
  // each in turn sums over every rank that holds another share.
  for (const auto& d : dims_) d->sum_over_group(sq);
}

std::shared_ptr<void> ComposedParallel::gather_full_params(TrainingModule& module, bool writeback) {
  // Innermost first (a tensor-parallel part made whole), released in the
  // reverse order.
  std::vector<std::shared_ptr<void>> held;
  for (auto d = dims_.rbegin(); d != dims_.rend(); ++d) held.push_back((*d)->gather_full_params(module, writeback));
  return std::shared_ptr<void>(nullptr, [held = std::move(held)](void*) mutable {
    while (!held.empty()) held.pop_back();
  });
}

std::vector<StatePiece> ComposedParallel::to_global(std::vector<StatePiece> pieces, StateUse use) const {
  for (auto d = dims_.rbegin(); d != dims_.rend(); ++d) pieces = (*d)->to_global(std::move(pieces), use);
  return pieces;
}

}  // namespace strata
