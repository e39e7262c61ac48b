#include "local_sgd.h"

#include <sstream>

namespace local_sgd {

LocalSGDStrategy::LocalSGDStrategy(strata::Comm comm, LocalSGDOptions options)
    : Strategy(std::move(comm)), options_(std::move(options)) {
  TORCH_CHECK_VALUE(options_.sync_every() >= 1, "local-sgd: sync_every must be >= 1, got ", options_.sync_every());
}

void LocalSGDStrategy::setup(strata::TrainingModule& module) {
  Strategy::setup(module);
  // Why: the ranks must start from one model for their average to mean anything.
  strata::broadcast_module_state(comm(), module.module());
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flat;
  for (const auto& p : params()) flat.push_back(p.detach().reshape(-1));
  anchor_ = torch::cat(flat);
  // Plain averaging has no outer momentum (what the memory model counts).
  momentum_ = options_.outer_optimizer() == "nesterov" ? torch::zeros_like(anchor_) : torch::Tensor();
  steps_ = 0;
}

void LocalSGDStrategy::optimizer_step(torch::optim::Optimizer& optimizer) {
  Strategy::optimizer_step(optimizer);
  if (++steps_ % options_.sync_every() == 0) synchronize();
}

void LocalSGDStrategy::synchronize() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flat;
  for (const auto& p : params()) flat.push_back(p.detach().reshape(-1));
  auto average = torch::cat(flat);
  // Why a collective here: this is the only point where the ranks meet; every
  // rank reaches it at the same step (the same K), so none waits on another.
  comm().all_reduce(average);
  average.div_(world_size());
  if (options_.outer_optimizer() == "average") {
    anchor_.copy_(average);
  } else {
    // DiLoCo: the change since the last synchronisation, averaged, is the
    // outer gradient (anchor - average); SGD with Nesterov momentum steps the anchor.
    const auto delta = anchor_ - average;
    momentum_.mul_(options_.outer_momentum()).add_(delta);
    anchor_.sub_(delta.add(momentum_, options_.outer_momentum()), options_.outer_lr());
  }
  int64_t offset = 0;
  for (const auto& p : params()) {
    p.detach().copy_(anchor_.narrow(0, offset, p.numel()).view_as(p));
    offset += p.numel();
  }
}

std::string LocalSGDStrategy::describe() const {
  std::ostringstream out;
  out << "local-sgd: " << world_size() << " rank(s) each step alone; every " << options_.sync_every()
      << " step(s) the parameters are averaged";
  if (options_.outer_optimizer() == "nesterov") {
    out << " and the averaged change is an outer Nesterov step (lr " << options_.outer_lr() << ", momentum "
        << options_.outer_momentum() << ")";
  }
  return out.str();
}

strata::StrategySpec local_sgd_spec() {
  using strata::StrategyOption;
  return strata::StrategySpec("local-sgd",
                              "each rank steps alone; every --sync-every steps the parameters are averaged "
                              "(DiLoCo: an outer Nesterov step on the averaged change)")
      .options({StrategyOption::integer("sync-every", 8, "local-sgd: optimizer steps between synchronisations")
                    .at_least(1),
                StrategyOption::choice("outer-optimizer", "nesterov", {"nesterov", "average"},
                                       "local-sgd: nesterov (DiLoCo's outer SGD with Nesterov momentum on the "
                                       "averaged change) or average (the average replaces the parameters)"),
                StrategyOption::real("outer-lr", 0.7, "local-sgd, nesterov: the outer learning rate").above(0),
                StrategyOption::real("outer-momentum", 0.9, "local-sgd, nesterov: the outer momentum").at_least(0)})
      .validate([](const strata::StrategyArgs& a) -> std::string {
        if (a.text("outer-optimizer") != "average") return "";
        for (const char* key : {"outer-lr", "outer-momentum"}) {
          if (a.given(key)) return std::string("--") + key + " applies to --outer-optimizer nesterov only (it would be ignored)";
        }
        return "";
      })
      .factory([](strata::Comm comm, const strata::StrategyArgs& a, const strata::StrategyContext& context) {
        auto s = std::make_unique<LocalSGDStrategy>(std::move(comm), LocalSGDOptions()
                                                                         .sync_every(a.integer("sync-every"))
                                                                         .outer_optimizer(a.text("outer-optimizer"))
                                                                         .outer_lr(a.real("outer-lr"))
                                                                         .outer_momentum(a.real("outer-momentum")));
        // --offload: the inner optimizer's state in the tier, as ddp does.
        return strata::offload_optimizer_state_as_asked(std::move(s), context);
      })
      .check(strata::optimizer_offload_problem)
      .memory([](const strata::MemoryQuery& q) {
        auto m = strata::replicated_memory(q);
        // The last synchronised parameters, and the outer momentum.
        m->held = 4 * q.model.trainable * (q.args.text("outer-optimizer") == "nesterov" ? 2 : 1);
        return m;
      })
      .communication([](const strata::MemoryQuery& q) {
        const double n = q.world_size;
        strata::CommEstimate c;
        c.bytes[strata::CollectiveKind::kAllReduce] =
            2.0 * (n - 1) / n * 4.0 * double(q.model.trainable) / double(q.args.integer("sync-every"));
        return std::optional<strata::CommEstimate>(c);
      })
      // Fastest (least communication), but it trains differently from one
      // process: listed by the planner, never picked by --strategy auto.
      .plan({{.label = "local-sgd", .speed_rank = 8, .min_world_size = 2, .exact = false}})
      .bench({{.tag = "k1",
               .flags = {"--sync-every", "1", "--outer-optimizer", "average"},
               .about = "averaged every step (plain local SGD): ddp's bytes, ddp's training with SGD"}});
}

}  // namespace local_sgd
