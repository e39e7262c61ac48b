#pragma once
// FsdpUnit: one unit as FSDPStrategy runs it (a wrap unit, or the root), as
// torch FSDP2's FSDPParamGroup. It owns its trainable FlatParam and its frozen
// one (either may be absent, not both), the GradSync indices of its trainable
// parameters, and what this micro-batch has done with it, from which it knows
// when its frozen part may be freed. The strategy holds the units in forward
// order (the root last) and one index into them per module unit, bucket and
// hooked parameter.
#include "strata/strategies/fsdp/flat_param.h"

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace strata {

class FsdpUnit {
 public:
  FsdpUnit(std::string name, std::unique_ptr<FlatParam> train, std::unique_ptr<FlatParam> frozen);

  const std::string& name() const { return name_; }
  /// The trainable part; null when the unit has trainable parameters none.
  FlatParam* train() const { return train_.get(); }
  /// The frozen part (requires_grad false: gathered, never reduced); null when none.
  FlatParam* frozen() const { return frozen_.get(); }
  /// The part whose dtypes the unit runs with: the trainable one, else the frozen one.
  FlatParam& lead() const { return train_ != nullptr ? *train_ : *frozen_; }
  /// fn(FlatParam&) on each part, the frozen one first.
  template <typename Fn>
  void for_parts(Fn&& fn) const {
    if (frozen_ != nullptr) fn(*frozen_);
    if (train_ != nullptr) fn(*train_);
  }
  /// A sharded part holds its full parameters (gathered or being gathered).
  bool holds_full() const;
  /// A sharded part does not hold its full parameters: a gather has work to do.
  bool needs_gather() const;
  void reshard();

  /// The GradSync indices of the trainable part's parameters (in its order).
  std::vector<size_t>& hooks() { return hooks_; }
  const std::vector<size_t>& hooks() const { return hooks_; }

  // ---- This micro-batch (begin_micro_batch clears it). ----
  void begin_micro_batch();
  /// A forward with grad ran the unit; a second one is an error with a frozen
  /// part (its backward could read the part after the first freed it).
  bool ran_with_grad() const { return ran_with_grad_; }
  void mark_ran_with_grad() { ran_with_grad_ = true; }
  /// The unit's input needs a gradient: its arrival is reported (input_done).
  void mark_input_hooked() { input_hooked_ = true; }
  void mark_input_done() { input_done_ = true; }
  /// Every gradient of the trainable part is accumulated.
  void mark_train_done() { train_done_ = true; }
  /// Frees the frozen part once nothing in backward reads it any more: after
  /// the input's gradient (when it was hooked) and the trainable part's.
  void maybe_reshard_frozen();

 private:
  std::string name_;
  std::unique_ptr<FlatParam> train_;
  std::unique_ptr<FlatParam> frozen_;
  std::vector<size_t> hooks_;
  bool ran_with_grad_ = false;
  bool input_hooked_ = false;
  bool input_done_ = false;
  bool train_done_ = false;
};

}  // namespace strata
