#include "strata/strategies/fsdp/unit.h"

#include <c10/util/Exception.h>

namespace strata {

FsdpUnit::FsdpUnit(std::string name, std::unique_ptr<FlatParam> train, std::unique_ptr<FlatParam> frozen)
    : name_(std::move(name)), train_(std::move(train)), frozen_(std::move(frozen)) {
  TORCH_CHECK(train_ != nullptr || frozen_ != nullptr, "FsdpUnit '", name_, "': a unit needs parameters");
}

bool FsdpUnit::holds_full() const {
  bool any = false;
  for_parts([&](const FlatParam& part) { any = any || (part.sharded() && part.holds_full()); });
  return any;
}

bool FsdpUnit::needs_gather() const {
  bool any = false;
  for_parts([&](const FlatParam& part) { any = any || (part.sharded() && !part.holds_full()); });
  return any;
}

void FsdpUnit::reshard() {
  for_parts([](FlatParam& part) { part.reshard(); });
}

void FsdpUnit::begin_micro_batch() { ran_with_grad_ = input_hooked_ = input_done_ = train_done_ = false; }

void FsdpUnit::maybe_reshard_frozen() {
  // A backward node reading the frozen part computes the gradient of an
  // input that needs one: one made from the unit's input (its gradient
  // completes after the node) or from the unit's trainable parameters
  // (theirs do). After both, no node reads it. The root (never run through
  // run_unit: its inputs come from every unit) waits for backward's end.
  // Local only: no rank issues a collective here.
  if (frozen_ == nullptr || !ran_with_grad_) return;
  if (input_hooked_ && !input_done_) return;
  if (train_ != nullptr && !train_done_) return;
  frozen_->reshard();
}

}  // namespace strata
