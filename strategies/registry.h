#pragma once
// StrategyRegistry: name (and aliases) -> configured Strategy factory, as
// Lightning's StrategyRegistry. Filled explicitly by register_builtin_strategies()
// (no self-registering statics: the linker drops unreferenced objects).
#include "strategies/comm.h"
#include "strategies/strategy.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace strata {

/// Knobs a strategy factory may read; each strategy validates its own.
struct StrategyConfig {
  double bucket_cap_mb = 25.0;          ///< DDP/SDP gradient bucket size
  bool find_unused_parameters = false;  ///< ddp/oss/sdp/fsdp: tolerate params with no grad (grad_sync.h)
  bool overlap_comm = true;             ///< DDP: all-reduce from grad hooks (false: after backward)
  std::string sharding_strategy = "full_shard";  ///< FSDP: full_shard, shard_grad_op, no_shard, hybrid_shard
  std::string reshard_after_forward = "auto";    ///< FSDP: auto, true, false
  bool limit_all_gathers = true;                 ///< FSDP: at most 2 units gathered at once
  std::string wrap_policy = "block";             ///< FSDP: block, none
  /// Ranks per node (LOCAL_WORLD_SIZE); FSDP hybrid_shard shards inside a
  /// node. 0: unknown (hybrid_shard then refuses to start).
  int local_world_size = 0;
  std::string param_dtype = "fp32";              ///< FSDP: all-gather dtype, fp32 or bf16 (bf16-mixed)
  std::string reduce_dtype = "fp32";             ///< FSDP: gradient reduction dtype, fp32 or bf16
  /// none, cpu, disk: where state lives between uses (fsdp: parameter
  /// shards, gradients, optimizer state; the others: optimizer state).
  std::string offload = "none";
  std::string offload_dir;                       ///< disk: directory of the (unnamed) offload file
};

class StrategyRegistry {
 public:
  using Factory = std::function<std::unique_ptr<Strategy>(Comm, const StrategyConfig&)>;

  /// Adds `name`; a duplicate name is an error.
  void add(const std::string& name, Factory factory, const std::string& description);
  /// Makes `alias` resolve to the already-registered `target`.
  void add_alias(const std::string& alias, const std::string& target);

  /// Throws "unknown strategy 'x'; available: ..." for unknown names.
  std::unique_ptr<Strategy> create(const std::string& name, Comm comm,
                                   const StrategyConfig& config = {}) const;

  bool contains(const std::string& name) const;
  /// Canonical name for a name or alias; throws like create() when unknown.
  std::string resolve(const std::string& name) const;
  /// "single, ddp, oss (zero1), ..." for error messages and --help.
  std::string available() const;
  std::vector<std::string> names() const;
  std::string description(const std::string& name) const;

 private:
  struct Entry {
    Factory factory;
    std::string description;
  };
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> aliases_;
  std::vector<std::string> order_;
};

/// Registers single, ddp, oss/zero1, sdp/zero2 (and later fsdp/zero3).
void register_builtin_strategies(StrategyRegistry& registry);

}  // namespace strata
