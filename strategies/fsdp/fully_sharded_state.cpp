// FSDPStrategy's state, as the rest of strata sees it: the ShardedState seam
// (norms and scaling of the gradient shards for clipping, the bytes it holds,
// the full parameters gathered on request) and the pieces checkpoints save.
// Kept apart from the forward/backward/step logic of fully_sharded.cpp.
#include "strata/strategies/fsdp/fully_sharded.h"

#include <torch/csrc/autograd/variable.h>

#include <optional>

namespace strata {

std::vector<torch::Tensor> FSDPStrategy::shard_grad_norms() const {
  // hybrid_shard: the other nodes hold copies of node 0's shards; only node 0
  // contributes, so the world's sum counts each element once.
  if (shard_world_ > 1 && replicate_comm_.rank() != 0) return {};
  // Shard gradients, padding included: padding gradients are zero.
  std::vector<torch::Tensor> norms;
  for (const auto& unit : units_) {
    if (unit->train() != nullptr) norms.push_back(unit->train()->shard_grad_norm());
  }
  return norms;
}

std::vector<Strategy::ParamPiece> FSDPStrategy::grad_pieces_for_norm() const {
  if (shard_world_ > 1 && replicate_comm_.rank() != 0) return {};  // as shard_grad_norms
  if (tier_ == nullptr) return Strategy::grad_pieces_for_norm();
  // Offloaded: the gradients are in the tier. Each piece's norm, kept when
  // it was written, stands in for it (one element, the same 2-norm).
  std::unordered_map<const void*, size_t> index_of;
  for (size_t k = 0; k < params().size(); ++k) index_of[params()[k].unsafeGetTensorImpl()] = k;
  std::vector<ParamPiece> out;
  for (const FlatParam* unit : trainable_parts()) {
    const auto layout_pieces = unit->layout().pieces(unit->shard_rank());
    const torch::Tensor norms = unit->shard_grad_piece_norms();
    for (size_t j = 0; j < layout_pieces.size(); ++j) {
      const auto& lp = layout_pieces[j];
      out.push_back({index_of.at(unit->params()[lp.param_index].unsafeGetTensorImpl()), lp.param_offset,
                     norms.narrow(0, static_cast<int64_t>(j), 1)});
    }
  }
  return out;
}

void FSDPStrategy::scale_shard_grads(double coef) {
  for (auto& unit : units_) {
    if (unit->train() != nullptr) unit->train()->scale_shard_grad(coef);
  }
}

ModelStateBytes FSDPStrategy::held_state_bytes(const torch::optim::Optimizer& optimizer) const {
  ModelStateBytes bytes;
  for (const FlatParam* unit : trainable_parts()) {
    bytes.params += unit->param_bytes();
    bytes.grads += unit->grad_bytes();
  }
  for (const FlatParam* unit : frozen_parts()) bytes.params += unit->param_bytes();
  bytes.optimizer = optimizer_state_bytes(optimizer);
  return bytes;
}

std::vector<Strategy::ParamPiece> FSDPStrategy::shard_pieces(StateUse use, bool detach) const {
  std::vector<ParamPiece> out;
  if (tier_ != nullptr) return out;  // offloaded: offloaded_state_pieces streams them
  // hybrid_shard / no_shard: the other replicas hold copies of these shards.
  if (use == StateUse::kSave && replicate_comm_.rank() != 0) return out;
  std::unordered_map<const void*, size_t> index_of;
  for (size_t k = 0; k < params().size(); ++k) index_of[params()[k].unsafeGetTensorImpl()] = k;
  for (const FlatParam* unit : trainable_parts()) {
    const auto layout_pieces = unit->layout().pieces(unit->shard_rank());
    for (size_t j = 0; j < unit->pieces().size(); ++j) {
      const auto& lp = layout_pieces[j];  // pieces() are cut in this order (flat_param.cpp)
      const auto& values = unit->pieces()[j];
      out.push_back({index_of.at(unit->params()[lp.param_index].unsafeGetTensorImpl()), lp.param_offset,
                     detach ? values.detach() : values});
    }
  }
  return out;
}

std::vector<NamedPiece> FSDPStrategy::frozen_pieces(StateUse use) const {
  std::vector<NamedPiece> out;
  if (tier_ != nullptr) return out;  // offloaded: offloaded_state_pieces streams them
  if (use == StateUse::kSave && replicate_comm_.rank() != 0) return out;  // the other replicas hold copies
  for (const FlatParam* unit : frozen_parts()) {
    const auto layout_pieces = unit->layout().pieces(unit->shard_rank());
    for (size_t j = 0; j < unit->pieces().size(); ++j) {
      const auto& lp = layout_pieces[j];  // pieces() are cut in this order (flat_param.cpp)
      out.push_back({unit->param_names()[lp.param_index], unit->param_shape(lp.param_index), lp.param_offset,
                     unit->pieces()[j].detach()});
    }
  }
  return out;
}

std::vector<StatePiece> FSDPStrategy::offloaded_state_pieces(torch::optim::Optimizer& optimizer, StateUse use) {
  std::vector<StatePiece> out;
  if (tier_ == nullptr) return out;
  // hybrid_shard / no_shard: the other replicas hold copies of these shards.
  if (use == StateUse::kSave && replicate_comm_.rank() != 0) return out;
  TORCH_CHECK(offloaded_optimizer_ == nullptr || &optimizer == offloaded_optimizer_, name(),
              ": with offload, checkpoint the optimizer setup_optimizer() made");
  // Every unit's shard pieces, read from and written to the tier in chunks;
  // the trainable ones with their moments (trainable_parts() index = the optimizer's unit index).
  auto add_unit = [&](FlatParam& unit, std::optional<size_t> optimizer_unit) {
    const int64_t shard_begin = unit.layout().shard_begin(unit.shard_rank());
    const int64_t esize = static_cast<int64_t>(c10::elementSize(unit.dtype()));
    for (const auto& lp : unit.layout().pieces(unit.shard_rank())) {
      const std::string& param = unit.param_names()[lp.param_index];
      const auto& shape = unit.param_shape(lp.param_index);
      const int64_t begin = lp.flat_offset - shard_begin;
      out.push_back(tier_piece(*tier_, unit.shard_region(), begin * esize, lp.numel, unit.dtype(), "model/" + param,
                               shape, lp.param_offset));
      if (!optimizer_unit || offloaded_optimizer_ == nullptr) continue;
      const bool with_step = use == StateUse::kLoad || lp.param_offset == 0;
      for (auto& p : offloaded_optimizer_->state_pieces_of(*optimizer_unit, begin, param, shape, lp.param_offset, with_step)) {
        out.push_back(std::move(p));
      }
    }
  };
  const std::vector<FlatParam*> trainable = trainable_parts();
  for (size_t u = 0; u < trainable.size(); ++u) add_unit(*trainable[u], u);
  for (FlatParam* unit : frozen_parts()) add_unit(*unit, std::nullopt);
  return out;
}

std::vector<Strategy::ParamPiece> FSDPStrategy::param_pieces(StateUse use) const {
  return shard_pieces(use, /*detach=*/true);
}

std::vector<Strategy::ParamPiece> FSDPStrategy::optimizer_param_pieces(StateUse use) const {
  return shard_pieces(use, /*detach=*/false);
}

FSDPStrategy::FullParams FSDPStrategy::summon_full_params(bool writeback) {
  // Sync point: every rank gathers every unit, in unit order.
  // exact: the full-precision values even under param_dtype (export, checkpoints).
  for (FlatParam* unit : trainable_parts()) unit->finish_gather(shard_comm_, /*exact=*/true);
  for (FlatParam* unit : frozen_parts()) unit->finish_gather(shard_comm_, /*exact=*/true);
  return FullParams(this, writeback);
}

std::shared_ptr<void> FSDPStrategy::gather_full_params(bool writeback) {
  return std::make_shared<FullParams>(summon_full_params(writeback));
}

FSDPStrategy::FullParams::~FullParams() {
  if (strategy_ == nullptr) return;
  if (writeback_) {
    for (FlatParam* unit : strategy_->trainable_parts()) unit->write_back();
    for (FlatParam* unit : strategy_->frozen_parts()) unit->write_back();
  }
  strategy_->reshard_all();
}
}  // namespace strata
