#include "strategies/registry.h"

#include "strategies/ddp.h"
#include "strategies/offload_tier.h"
#include "strategies/fsdp/fully_sharded.h"
#include "strategies/oss.h"
#include "strategies/sdp.h"
#include "strategies/single_device.h"

#include <sstream>

namespace strata {

void StrategyRegistry::add(const std::string& name, Factory factory, const std::string& description) {
  TORCH_CHECK(!contains(name), "strategy '", name, "' is already registered");
  entries_.emplace(name, Entry{std::move(factory), description});
  order_.push_back(name);
}

void StrategyRegistry::add_alias(const std::string& alias, const std::string& target) {
  TORCH_CHECK(!contains(alias), "strategy '", alias, "' is already registered");
  TORCH_CHECK(entries_.count(target) == 1, "alias '", alias, "' points to unknown strategy '",
              target, "'");
  aliases_.emplace(alias, target);
}

bool StrategyRegistry::contains(const std::string& name) const {
  return entries_.count(name) == 1 || aliases_.count(name) == 1;
}

std::string StrategyRegistry::resolve(const std::string& name) const {
  if (entries_.count(name) == 1) return name;
  auto alias = aliases_.find(name);
  TORCH_CHECK_VALUE(alias != aliases_.end(), "unknown strategy '", name, "'; available: ",
                    available());
  return alias->second;
}

std::unique_ptr<Strategy> StrategyRegistry::create(const std::string& name, Comm comm,
                                                   const StrategyConfig& config) const {
  return entries_.at(resolve(name)).factory(std::move(comm), config);
}

std::string StrategyRegistry::available() const {
  std::ostringstream out;
  for (size_t i = 0; i < order_.size(); ++i) {
    if (i > 0) out << ", ";
    out << order_[i];
    std::string aliases;
    for (const auto& [alias, target] : aliases_) {
      if (target == order_[i]) aliases += (aliases.empty() ? "" : ", ") + alias;
    }
    if (!aliases.empty()) out << " (" << aliases << ")";
  }
  return out.str();
}

std::vector<std::string> StrategyRegistry::names() const {
  std::vector<std::string> all = order_;
  for (const auto& [alias, target] : aliases_) all.push_back(alias);
  return all;
}

std::string StrategyRegistry::description(const std::string& name) const {
  return entries_.at(resolve(name)).description;
}

namespace {
/// single, ddp, oss, sdp: `offload` keeps the optimizer state in a tier
/// (offloaded_moments.h); their parameters and gradients stay resident.
std::unique_ptr<Strategy> with_offload(std::unique_ptr<Strategy> strategy, const StrategyConfig& c) {
  const OffloadKind kind = parse_offload(c.offload);
  if (kind == OffloadKind::kNone) return strategy;
  check_offload_kind(kind, c.offload_dir, strategy->device());
  strategy->offload_optimizer_state(make_offload_tier(kind, c.offload_dir), kDefaultOffloadChunkNumel);
  return strategy;
}
}  // namespace

void register_builtin_strategies(StrategyRegistry& registry) {
  registry.add(
      "single",
      [](Comm comm, const StrategyConfig& c) { return with_offload(std::make_unique<SingleDeviceStrategy>(comm), c); },
      "one process; nothing sharded");
  registry.add(
      "ddp",
      [](Comm comm, const StrategyConfig& c) {
        return with_offload(std::make_unique<DDPStrategy>(
                                comm, DDPOptions()
                                          .bucket_cap_mb(c.bucket_cap_mb)
                                          .find_unused_parameters(c.find_unused_parameters)
                                          .overlap_comm(c.overlap_comm)),
                            c);
      },
      "replicated model; bucketed gradient all-reduce overlapped with backward");
  registry.add(
      "oss",
      [](Comm comm, const StrategyConfig& c) {
        return with_offload(std::make_unique<OSSStrategy>(comm, ShardOptions()
                                                                     .bucket_cap_mb(c.bucket_cap_mb)
                                                                     .find_unused_parameters(c.find_unused_parameters)),
                            c);
      },
      "ZeRO-1: optimizer state sharded; grads reduce-scattered after backward");
  registry.add_alias("zero1", "oss");
  registry.add(
      "sdp",
      [](Comm comm, const StrategyConfig& c) {
        return with_offload(std::make_unique<SDPStrategy>(comm, ShardOptions()
                                                                     .bucket_cap_mb(c.bucket_cap_mb)
                                                                     .find_unused_parameters(c.find_unused_parameters)),
                            c);
      },
      "ZeRO-2: optimizer state and grads sharded; grads reduced to owners during backward");
  registry.add_alias("zero2", "sdp");
  registry.add(
      "fsdp",
      [](Comm comm, const StrategyConfig& c) {
        TORCH_CHECK_VALUE(c.reshard_after_forward == "auto" || c.reshard_after_forward == "true" ||
                              c.reshard_after_forward == "false",
                          "unknown reshard_after_forward '", c.reshard_after_forward,
                          "'; allowed: auto, true, false");
        FSDPOptions options;
        options.sharding_strategy(parse_sharding_strategy(c.sharding_strategy))
            .limit_all_gathers(c.limit_all_gathers)
            .wrap_policy(parse_wrap_policy(c.wrap_policy))
            .node_size(c.local_world_size)
            .find_unused_parameters(c.find_unused_parameters);
        // fp32: no cast (the parameters' own dtype, full precision).
        auto dtype = [](const std::string& what, const std::string& name) -> c10::optional<torch::ScalarType> {
          if (name == "fp32") return c10::nullopt;
          if (name == "fp16") return torch::kHalf;
          TORCH_CHECK_VALUE(name == "bf16", "unknown FSDP ", what, " '", name, "'; allowed: fp32, bf16, fp16");
          return torch::kBFloat16;
        };
        options.param_dtype(dtype("param_dtype", c.param_dtype))
            .reduce_dtype(dtype("reduce_dtype", c.reduce_dtype))
            .offload(parse_offload(c.offload))
            .offload_dir(c.offload_dir);
        if (c.reshard_after_forward != "auto") options.reshard_after_forward(c.reshard_after_forward == "true");
        return std::make_unique<FSDPStrategy>(comm, options);
      },
      "ZeRO-3: params, grads and optimizer state sharded per wrap unit; all-gather before "
      "forward and backward, grads reduce-scattered during backward");
  registry.add_alias("zero3", "fsdp");
}

}  // namespace strata
