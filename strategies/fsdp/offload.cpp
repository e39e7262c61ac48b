#include "strata/strategies/fsdp/offload.h"

#include "strata/kernels/fused_adamw.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace strata {

namespace {
int64_t element_bytes(const FlatParam& unit) { return static_cast<int64_t>(c10::elementSize(unit.dtype())); }
}  // namespace

FsdpOffloadedOptimizer::FsdpOffloadedOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                                       std::vector<FlatParam*> units, OffloadTier& tier, int64_t chunk_numel)
    : ExactGroupsOptimizer(std::move(groups), "offload"), units_(std::move(units)), tier_(tier) {
  TORCH_CHECK(chunk_numel > 0, "FsdpOffloadedOptimizer: chunk_numel must be > 0 (got ", chunk_numel, ")");
  // One kind of update for every group: AdamW (with torch's defaults for
  // amsgrad = false) or plain SGD, the two the Trainer builds.
  std::unordered_map<const void*, size_t> group_of;
  for (size_t g = 0; g < param_groups().size(); ++g) {
    auto& options = param_groups()[g].options();
    if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
      TORCH_CHECK(sgd->momentum() == 0.0 && sgd->dampening() == 0.0 && !sgd->nesterov(),
                  "offload steps SGD without momentum only (got momentum ", sgd->momentum(), ")");
      adamw_ = false;
    } else {
      auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options);
      TORCH_CHECK(adamw != nullptr && !adamw->amsgrad(),
                  "offload steps AdamW (without amsgrad) or SGD; got another optimizer's options");
      TORCH_CHECK(adamw_ || g == 0, "offload: parameter groups mix AdamW and SGD");
    }
    for (const auto& p : param_groups()[g].params()) group_of[p.unsafeGetTensorImpl()] = g;
  }
  int64_t largest = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    FlatParam& unit = *units_[u];
    TORCH_CHECK(unit.offloaded(), "FsdpOffloadedOptimizer: unit ", unit.name(), " is not offloaded");
    const int64_t numel = unit.layout().shard_numel();
    largest = std::max(largest, numel);
    if (adamw_) {
      // Zero-filled, like torch's lazily created exp_avg / exp_avg_sq.
      exp_avg_.push_back(tier_.allocate(numel * element_bytes(unit)));
      exp_avg_sq_.push_back(tier_.allocate(numel * element_bytes(unit)));
      state_bytes_ += 2 * numel * element_bytes(unit);
    }
    const int64_t shard_begin = unit.layout().shard_begin(unit.shard_rank());
    for (const auto& piece : unit.layout().pieces(unit.shard_rank())) {
      const void* param = unit.params()[piece.param_index].unsafeGetTensorImpl();
      auto it = group_of.find(param);
      if (it == group_of.end()) continue;  // not given to the optimizer: never stepped
      pieces_.push_back({u, piece.flat_offset - shard_begin, piece.numel, it->second, param});
    }
  }
  chunk_numel_ = std::max<int64_t>(1, std::min(chunk_numel, largest));
}

std::vector<StatePiece> FsdpOffloadedOptimizer::state_pieces_of(size_t unit, int64_t begin, const std::string& name,
                                                                 const std::vector<int64_t>& shape, int64_t lo,
                                                                 bool with_step) {
  std::vector<StatePiece> out;
  if (!adamw_) return out;
  for (auto& piece : pieces_) {
    if (piece.unit != unit || piece.begin != begin) continue;
    const auto dtype = units_[unit]->dtype();
    const int64_t offset = begin * element_bytes(*units_[unit]);
    const std::string prefix = "optim/" + name + "/";
    out.push_back(tier_piece(tier_, exp_avg_[unit], offset, piece.numel, dtype, prefix + "exp_avg", shape, lo));
    out.push_back(tier_piece(tier_, exp_avg_sq_[unit], offset, piece.numel, dtype, prefix + "exp_avg_sq", shape, lo));
    if (with_step) out.push_back(step_piece(prefix + "step", &piece.step));
    break;
  }
  return out;
}

int64_t FsdpOffloadedOptimizer::staging_bytes() const {
  // Two sets of {param, grad} (+ AdamW's two moments).
  return 2 * (adamw_ ? 4 : 2) * chunk_numel_ * static_cast<int64_t>(c10::elementSize(units_.front()->dtype()));
}

void FsdpOffloadedOptimizer::read_chunk(const Chunk& chunk, const Staging& b) const {
  const FlatParam& unit = *units_[chunk.unit];
  const int64_t at = chunk.begin * element_bytes(unit);
  tier_.read(unit.shard_region(), at, b.param);
  unit.read_shard_grad(chunk.begin, b.grad);
  if (adamw_) {
    tier_.read(exp_avg_[chunk.unit], at, b.exp_avg);
    tier_.read(exp_avg_sq_[chunk.unit], at, b.exp_avg_sq);
  }
}

void FsdpOffloadedOptimizer::write_chunk(const Chunk& chunk, const Staging& b) const {
  const FlatParam& unit = *units_[chunk.unit];
  const int64_t at = chunk.begin * element_bytes(unit);
  tier_.write(unit.shard_region(), at, b.param);
  if (adamw_) {
    tier_.write(exp_avg_[chunk.unit], at, b.exp_avg);
    tier_.write(exp_avg_sq_[chunk.unit], at, b.exp_avg_sq);
  }
}

void FsdpOffloadedOptimizer::step_chunk(const Chunk& chunk, const Staging& b,
                                    const std::vector<size_t>& active) const {
  const double grad_scale = units_[chunk.unit]->pending_grad_scale();
  // Clipping scaled a resident gradient in place before the step; the same
  // multiplication, on the same values, here.
  if (grad_scale != 1.0) b.grad.mul_(grad_scale);
  for (size_t i : active) {
    const Piece& piece = pieces_[i];
    const int64_t begin = std::max(piece.begin, chunk.begin);
    const int64_t end = std::min(piece.begin + piece.numel, chunk.begin + chunk.numel);
    if (begin >= end) continue;
    auto p = b.param.narrow(0, begin - chunk.begin, end - begin);
    auto g = b.grad.narrow(0, begin - chunk.begin, end - begin);
    const auto& options = param_groups()[piece.group].options();
    if (!adamw_) {
      // torch::optim::SGD (no momentum): d_p = g + wd * p; p -= lr * d_p.
      const auto& o = static_cast<const torch::optim::SGDOptions&>(options);
      auto d_p = o.weight_decay() != 0 ? g.add(p, o.weight_decay()) : g;
      p.add_(d_p, -1 * o.lr());
      continue;
    }
    // torch::optim::AdamW's update with the piece's own step count, in one
    // fused pass (kernels/fused_adamw.h: the same fp32 roundings as torch's).
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(options);
    auto m = b.exp_avg.narrow(0, begin - chunk.begin, end - begin);
    auto v = b.exp_avg_sq.narrow(0, begin - chunk.begin, end - begin);
    fused_adamw_step(p, g, m, v, AdamWStepOptions::from(o, piece.step));
  }
}

torch::Tensor FsdpOffloadedOptimizer::step(LossClosure closure) {
  TORCH_CHECK(closure == nullptr, "FsdpOffloadedOptimizer::step takes no closure");
  torch::NoGradGuard no_grad;
  // Which pieces step now; each advances its own count, as torch's
  // per-parameter state does (a skipped parameter keeps its count).
  std::vector<std::vector<size_t>> active(units_.size());
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (skipped_.count(pieces_[i].param) == 1) continue;
    ++pieces_[i].step;
    active[pieces_[i].unit].push_back(i);
  }
  std::vector<Chunk> chunks;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (active[u].empty()) continue;  // nothing of this unit steps: no I/O for it
    const int64_t numel = units_[u]->layout().shard_numel();
    for (int64_t begin = 0; begin < numel; begin += chunk_numel_) {
      chunks.push_back({u, begin, std::min(chunk_numel_, numel - begin)});
    }
  }
  if (chunks.empty()) return {};

  // Two staging sets, allocated for the step and freed after it.
  const auto options = torch::TensorOptions().dtype(units_.front()->dtype());
  auto make = [&] {
    Staging s;
    s.param = torch::empty({chunk_numel_}, options);
    s.grad = torch::empty({chunk_numel_}, options);
    if (adamw_) {
      s.exp_avg = torch::empty({chunk_numel_}, options);
      s.exp_avg_sq = torch::empty({chunk_numel_}, options);
    }
    return s;
  };
  const Staging sets[2] = {make(), make()};
  auto view = [&](int k, int64_t n) {
    const Staging& s = sets[k];
    Staging v;
    v.param = s.param.narrow(0, 0, n);
    v.grad = s.grad.narrow(0, 0, n);
    if (adamw_) {
      v.exp_avg = s.exp_avg.narrow(0, 0, n);
      v.exp_avg_sq = s.exp_avg_sq.narrow(0, 0, n);
    }
    return v;
  };

  auto staged = [&](size_t i) { return view(static_cast<int>(i % 2), chunks[i].numel); };
  // Sync points inside: a chunk is staged before its step, and every chunk
  // is written back before the next gather reads the updated shards.
  stream_chunks(
      io_, chunks.size(), [&](size_t i) { read_chunk(chunks[i], staged(i)); },
      [&](size_t i) { step_chunk(chunks[i], staged(i), active[chunks[i].unit]); },
      [&](size_t i) { write_chunk(chunks[i], staged(i)); });
  return {};
}

void FsdpOffloadedOptimizer::save(torch::serialize::OutputArchive&) const { refuse_offloaded_checkpoint(/*saving=*/true); }

void FsdpOffloadedOptimizer::load(torch::serialize::InputArchive&) { refuse_offloaded_checkpoint(/*saving=*/false); }

}  // namespace strata
