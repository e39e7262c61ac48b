// Strategy's checkpoint state: the pieces of model and optimizer state a rank
// holds, named independently of the strategy and the world size, so a
// checkpoint written by any strategy loads into any other (trainer/checkpoint.h).
// Implements the state-piece part of strategy.h (param_pieces,
// optimizer_param_pieces, state_pieces); the piece types are in state_pieces.h.
#include "strata/strategies/strategy.h"

#include "strata/strategies/offloaded_moments.h"

#include "strata/core/optim_state_key.h"

#include <unordered_set>

namespace strata {

namespace {
/// The key torch::optim uses for a parameter's state.
void* state_key(const torch::Tensor& p) { return optim_state_key(p); }

void add_piece(std::vector<StatePiece>& out, std::string name, std::vector<int64_t> shape, int64_t lo,
               const torch::Tensor& values) {
  if (!values.defined()) return;
  StatePiece piece;
  piece.name = std::move(name);
  piece.shape = std::move(shape);
  piece.dtype = values.scalar_type();
  piece.lo = lo;
  piece.values = values.reshape({-1});
  TORCH_CHECK(piece.values.is_same(values) || piece.values.data_ptr() == values.data_ptr(),
              "state piece ", piece.name, " is not contiguous; it cannot be filled in place");
  out.push_back(std::move(piece));
}

/// AdamW's (and Adam's) integer step count as a 1-element int64 piece; the
/// parameter's first element's owner saves it, every holder loads it.
template <typename State>
void add_step(std::vector<StatePiece>& out, const std::string& name, State* state) {
  StatePiece piece;
  piece.name = name;
  piece.shape = {};
  piece.dtype = torch::kLong;
  piece.values = torch::full({1}, state->step(), torch::kLong);
  piece.on_loaded = [state](const torch::Tensor& v) { state->step(v.item<int64_t>()); };
  out.push_back(std::move(piece));
}
}  // namespace

void Strategy::create_optimizer_state(torch::optim::Optimizer& optimizer) {
  const bool adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
  const bool adam = dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr;
  if (dynamic_cast<torch::optim::SGD*>(&optimizer) != nullptr) return create_sgd_momentum(optimizer);
  if (!adamw && !adam) return;  // others create theirs when stepping
  for (auto& group : optimizer.param_groups()) {
    const bool amsgrad = adamw ? static_cast<torch::optim::AdamWOptions&>(group.options()).amsgrad()
                               : static_cast<torch::optim::AdamOptions&>(group.options()).amsgrad();
    for (const auto& p : group.params()) {
      const auto key = state_key(p);
      if (optimizer.state().count(key) != 0) continue;
      // The zeros torch's step() would make for the parameter's first step.
      auto fill = [&](auto state) {
        state->step(0);
        state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        if (amsgrad) state->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        optimizer.state()[key] = std::move(state);
      };
      if (adamw) {
        fill(std::make_unique<torch::optim::AdamWParamState>());
      } else {
        fill(std::make_unique<torch::optim::AdamParamState>());
      }
    }
  }
}

void Strategy::create_sgd_momentum(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups()) {
    const auto& o = static_cast<torch::optim::SGDOptions&>(group.options());
    if (o.momentum() == 0.0) continue;  // plain SGD: no state
    // Zeros stand for "no buffer yet": with dampening 0, torch's first step
    // (buf = d_p) and a step from a zero buffer (buf = 0 * momentum + d_p)
    // give the same buffer, bit for bit.
    TORCH_CHECK(o.dampening() == 0.0, "checkpoints of SGD with dampening ", o.dampening(), " are not supported");
    for (const auto& p : group.params()) {
      const auto key = state_key(p);
      if (optimizer.state().count(key) != 0) continue;
      auto state = std::make_unique<torch::optim::SGDParamState>();
      state->momentum_buffer(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      optimizer.state()[key] = std::move(state);
    }
  }
}

std::vector<Strategy::ParamPiece> Strategy::param_pieces(StateUse use) const {
  std::vector<ParamPiece> out;
  // Replicated: rank 0 writes it (of the strategy's group; to_global keeps
  // one rank's of a ModelParallel's group).
  if (use == StateUse::kSave && comm_.rank() != 0) return out;
  for (size_t k = 0; k < params_.size(); ++k) out.push_back({k, 0, params_[k].detach().view({-1})});
  return out;
}

std::vector<Strategy::ParamPiece> Strategy::optimizer_param_pieces(StateUse use) const {
  std::vector<ParamPiece> out;
  if (use == StateUse::kSave && comm_.rank() != 0) return out;
  for (size_t k = 0; k < params_.size(); ++k) out.push_back({k, 0, params_[k]});
  return out;
}

std::vector<StatePiece> Strategy::offloaded_state_pieces(torch::optim::Optimizer& optimizer, StateUse use) {
  std::vector<StatePiece> out;
  auto* offloaded = dynamic_cast<OffloadedMomentsOptimizer*>(&optimizer);
  if (offloaded == nullptr) return out;
  for (const auto& piece : optimizer_param_pieces(use)) {
    // The step belongs to the whole parameter: as for resident state below.
    const bool with_step = use == StateUse::kLoad || piece.offset == 0;
    auto pieces = offloaded->state_pieces_of(piece.values, param_names_[piece.index], param_shape(piece.index),
                                             piece.offset, with_step);
    for (auto& p : pieces) out.push_back(std::move(p));
  }
  return out;
}

std::vector<NamedPiece> Strategy::frozen_pieces(StateUse use) const {
  std::vector<NamedPiece> out;
  if (use == StateUse::kSave && comm_.rank() != 0) return out;  // replicated: rank 0 writes it
  std::unordered_set<std::string> trainable(param_names_.begin(), param_names_.end());
  for (const auto& item : module().module().named_parameters(/*recurse=*/true)) {
    if (trainable.count(item.key()) == 0) {
      out.push_back({item.key(), item.value().sizes().vec(), 0, item.value().detach()});
    }
  }
  return out;
}

std::vector<StatePiece> Strategy::state_pieces(torch::optim::Optimizer& optimizer, StateUse use) {
  create_optimizer_state(optimizer);
  std::vector<StatePiece> out;
  torch::NoGradGuard no_grad;
  for (const auto& piece : param_pieces(use)) {
    add_piece(out, "model/" + param_names_[piece.index], param_shape(piece.index), piece.offset, piece.values);
  }
  for (const auto& piece : frozen_pieces(use)) {
    add_piece(out, "model/" + piece.name, piece.shape, piece.offset, piece.values);
  }
  // Buffers: held whole by every strategy.
  if (use == StateUse::kLoad || comm_.rank() == 0) {
    for (const auto& item : module().module().named_buffers(/*recurse=*/true)) {
      add_piece(out, "model/" + item.key(), item.value().sizes().vec(), 0, item.value());
    }
  }
  // State in an offload tier (the moments of an offloaded optimizer; fsdp's
  // offloaded shards): streamed pieces. Its optimizer's state() is empty.
  for (auto& piece : offloaded_state_pieces(optimizer, use)) out.push_back(std::move(piece));
  auto& states = optimizer.state();
  for (const auto& piece : optimizer_param_pieces(use)) {
    auto it = states.find(state_key(piece.values));
    if (it == states.end()) continue;  // no state (SGD without momentum)
    const std::string prefix = "optim/" + param_names_[piece.index] + "/";
    const auto shape = param_shape(piece.index);
    // The step count belongs to the whole parameter: its first element's
    // owner saves it, every rank holding a piece loads it.
    const bool with_step = use == StateUse::kLoad || piece.offset == 0;
    if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
      add_piece(out, prefix + "exp_avg", shape, piece.offset, s->exp_avg());
      add_piece(out, prefix + "exp_avg_sq", shape, piece.offset, s->exp_avg_sq());
      add_piece(out, prefix + "max_exp_avg_sq", shape, piece.offset, s->max_exp_avg_sq());
      if (with_step) add_step(out, prefix + "step", s);
    } else if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
      add_piece(out, prefix + "exp_avg", shape, piece.offset, s->exp_avg());
      add_piece(out, prefix + "exp_avg_sq", shape, piece.offset, s->exp_avg_sq());
      add_piece(out, prefix + "max_exp_avg_sq", shape, piece.offset, s->max_exp_avg_sq());
      if (with_step) add_step(out, prefix + "step", s);
    } else if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
      add_piece(out, prefix + "momentum_buffer", shape, piece.offset, s->momentum_buffer());
    } else {
      TORCH_CHECK(false, name(), ": checkpoints support AdamW, Adam and SGD optimizer state; parameter ",
                  param_names_[piece.index], " has state of another optimizer");
    }
  }
  if (model_parallel_) return model_parallel_->to_global(std::move(out), use);
  return out;
}

}  // namespace strata
