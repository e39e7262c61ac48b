#include "strata/strategies/offloaded_moments.h"

#include "strata/kernels/fused_adamw.h"

#include <algorithm>
#include <cmath>

namespace strata {

OffloadedMomentsOptimizer::OffloadedMomentsOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                                                 std::shared_ptr<OffloadTier> tier, int64_t chunk_numel)
    : ExactGroupsOptimizer(std::move(groups), "offload"), tier_(std::move(tier)) {
  TORCH_CHECK(tier_ != nullptr, "OffloadedMomentsOptimizer needs a tier");
  TORCH_CHECK(chunk_numel > 0, "OffloadedMomentsOptimizer: chunk_numel must be > 0 (got ", chunk_numel, ")");
  // One kind of update for every group: AdamW (amsgrad off) or plain SGD,
  // the two the Trainer builds.
  TORCH_CHECK(!param_groups().empty(), "OffloadedMomentsOptimizer: no parameter groups");
  adamw_ = dynamic_cast<torch::optim::SGDOptions*>(&param_groups().front().options()) == nullptr;
  int64_t largest = 1;
  for (size_t g = 0; g < param_groups().size(); ++g) {
    auto& options = param_groups()[g].options();
    if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
      TORCH_CHECK(!adamw_, "offload: parameter groups mix AdamW and SGD");
      TORCH_CHECK(sgd->momentum() == 0.0 && sgd->dampening() == 0.0 && !sgd->nesterov(),
                  "offload steps SGD without momentum only (got momentum ", sgd->momentum(), ")");
    } else {
      auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options);
      TORCH_CHECK(adamw != nullptr && !adamw->amsgrad(),
                  "offload steps AdamW (without amsgrad) or SGD; got another optimizer's options");
      TORCH_CHECK(adamw_, "offload: parameter groups mix AdamW and SGD");
    }
    const auto& params = param_groups()[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      TORCH_CHECK(p.is_contiguous(), "offload: parameter ", i, " of group ", g, " ", p.sizes(),
                  " is not contiguous; its moments are streamed as flat chunks");
      Entry e{g, i, {}, {}, 0};
      if (adamw_) {
        const int64_t nbytes = p.numel() * static_cast<int64_t>(p.element_size());
        e.exp_avg = tier_->allocate(nbytes);
        e.exp_avg_sq = tier_->allocate(nbytes);
        state_bytes_ += 2 * nbytes;
      }
      largest = std::max(largest, p.numel());
      entries_.push_back(e);
    }
  }
  chunk_numel_ = std::min(chunk_numel, largest);
}

void OffloadedMomentsOptimizer::step_chunk(const Chunk& chunk, const Staging& moments) const {
  const Entry& e = entries_[chunk.entry];
  const auto& param = param_of(e);
  auto p = param.view({-1}).narrow(0, chunk.begin, chunk.numel);
  auto g = param.grad().reshape({-1}).narrow(0, chunk.begin, chunk.numel);
  const auto& o = static_cast<const torch::optim::AdamWOptions&>(param_groups()[e.group].options());
  if (p.is_cpu()) {
    // torch::optim::AdamW's update in one fused pass (the same fp32 roundings).
    fused_adamw_step(p, g, moments.exp_avg, moments.exp_avg_sq, AdamWStepOptions::from(o, e.step));
    return;
  }
  // Elsewhere (CUDA, with --offload cpu): torch::optim::AdamW's own tensor
  // ops on the moments brought to the parameter's device.
  auto m = moments.exp_avg.to(p.device(), /*non_blocking=*/true);
  auto v = moments.exp_avg_sq.to(p.device(), /*non_blocking=*/true);
  const double beta1 = std::get<0>(o.betas());
  const double beta2 = std::get<1>(o.betas());
  const double bias1 = 1 - std::pow(beta1, static_cast<double>(e.step));
  const double bias2 = 1 - std::pow(beta2, static_cast<double>(e.step));
  p.mul_(1 - o.lr() * o.weight_decay());
  m.mul_(beta1).add_(g, 1 - beta1);
  v.mul_(beta2).addcmul_(g, g, 1 - beta2);
  auto denom = (v.sqrt() / std::sqrt(bias2)).add_(o.eps());
  p.addcdiv_(m, denom, -o.lr() / bias1);
  moments.exp_avg.copy_(m);
  moments.exp_avg_sq.copy_(v);
}

torch::Tensor OffloadedMomentsOptimizer::step(LossClosure closure) {
  TORCH_CHECK(closure == nullptr, "OffloadedMomentsOptimizer::step takes no closure");
  torch::NoGradGuard no_grad;
  std::vector<Chunk> chunks;
  for (size_t k = 0; k < entries_.size(); ++k) {
    Entry& e = entries_[k];
    const auto& p = param_of(e);
    if (!p.grad().defined()) continue;  // as torch: no gradient, no step, count kept
    ++e.step;
    if (!adamw_) {
      // torch::optim::SGD without momentum: no state to stream.
      const auto& o = static_cast<const torch::optim::SGDOptions&>(param_groups()[e.group].options());
      auto d_p = o.weight_decay() != 0 ? p.grad().add(p, o.weight_decay()) : p.grad();
      p.add_(d_p, -1 * o.lr());
      continue;
    }
    for (int64_t begin = 0; begin < p.numel(); begin += chunk_numel_) {
      chunks.push_back({k, begin, std::min(chunk_numel_, p.numel() - begin)});
    }
  }
  if (chunks.empty()) return {};

  const auto dtype = param_of(entries_[chunks.front().entry]).dtype();
  auto make = [&] {
    return Staging{torch::empty({chunk_numel_}, torch::TensorOptions().dtype(dtype)),
                   torch::empty({chunk_numel_}, torch::TensorOptions().dtype(dtype))};
  };
  const Staging sets[2] = {make(), make()};
  auto view = [&](size_t i) {
    const Staging& s = sets[i % 2];
    return Staging{s.exp_avg.narrow(0, 0, chunks[i].numel), s.exp_avg_sq.narrow(0, 0, chunks[i].numel)};
  };
  auto at = [&](const Chunk& c) { return c.begin * static_cast<int64_t>(c10::elementSize(param_of(entries_[c.entry]).scalar_type())); };
  auto read = [&](size_t i) {
    const Staging b = view(i);
    const Entry& e = entries_[chunks[i].entry];
    tier_->read(e.exp_avg, at(chunks[i]), b.exp_avg);
    tier_->read(e.exp_avg_sq, at(chunks[i]), b.exp_avg_sq);
  };
  auto write = [&](size_t i) {
    const Staging b = view(i);
    const Entry& e = entries_[chunks[i].entry];
    tier_->write(e.exp_avg, at(chunks[i]), b.exp_avg);
    tier_->write(e.exp_avg_sq, at(chunks[i]), b.exp_avg_sq);
  };

  // Sync points inside: a chunk's moments are staged before its step, and
  // every chunk is written back before the next step reads it.
  stream_chunks(io_, chunks.size(), read, [&](size_t i) { step_chunk(chunks[i], view(i)); }, write);
  return {};
}

void OffloadedMomentsOptimizer::save(torch::serialize::OutputArchive&) const { refuse_offloaded_checkpoint(/*saving=*/true); }

void OffloadedMomentsOptimizer::load(torch::serialize::InputArchive&) { refuse_offloaded_checkpoint(/*saving=*/false); }

std::vector<StatePiece> OffloadedMomentsOptimizer::state_pieces_of(const torch::Tensor& param, const std::string& name,
                                                                   const std::vector<int64_t>& shape, int64_t lo,
                                                                   bool with_step) {
  std::vector<StatePiece> out;
  if (!adamw_) return out;
  for (auto& e : entries_) {
    const auto& p = param_of(e);
    if (!p.is_same(param)) continue;
    const std::string prefix = "optim/" + name + "/";
    out.push_back(tier_piece(*tier_, e.exp_avg, 0, p.numel(), p.scalar_type(), prefix + "exp_avg", shape, lo));
    out.push_back(tier_piece(*tier_, e.exp_avg_sq, 0, p.numel(), p.scalar_type(), prefix + "exp_avg_sq", shape, lo));
    if (with_step) out.push_back(step_piece(prefix + "step", &e.step));
    break;
  }
  return out;
}

OptimizerFactory offloading_optimizer_factory(OptimizerFactory factory, std::shared_ptr<OffloadTier> tier,
                                         int64_t chunk_numel) {
  TORCH_CHECK(factory && tier, "offloading_optimizer_factory needs a factory and a tier");
  return [factory = std::move(factory), tier = std::move(tier),
          chunk_numel](std::vector<torch::optim::OptimizerParamGroup> groups) {
    // The factory's own optimizer resolves each group's options (its
    // defaults fill what a group leaves unset); torch optimizers create
    // their state lazily, so building it costs nothing but the groups.
    auto inner = factory(std::move(groups));
    std::vector<torch::optim::OptimizerParamGroup> resolved;
    for (auto& group : inner->param_groups()) resolved.emplace_back(group.params(), group.options().clone());
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<OffloadedMomentsOptimizer>(std::move(resolved), tier, chunk_numel));
  };
}

}  // namespace strata
