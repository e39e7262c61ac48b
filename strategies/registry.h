#pragma once
// StrategyRegistry: the registered StrategySpecs (spec.h) by name and alias,
// as Lightning's StrategyRegistry. Filled explicitly — the built-ins by
// register_builtin_strategies(), a user's by registry.add(their_spec()) — with
// no self-registering statics (the linker drops unreferenced objects).
//
// Example:
//   strata::StrategyRegistry registry;
//   strata::register_builtin_strategies(registry);
//   registry.add(my_strategy_spec());
//   auto strategy = registry.create(name, comm, {{"sharding-strategy", "shard_grad_op"}});
#include "strata/strategies/comm.h"
#include "strata/strategies/spec.h"
#include "strata/strategies/strategy.h"

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace strata {

class StrategyRegistry {
 public:
  /// Adds `spec` under its name and aliases. Errors (naming them) for a name
  /// or alias already taken, a spec without a factory, a second reference
  /// spec, or an option key declared again with another kind or default.
  void add(StrategySpec spec);

  bool contains(const std::string& name) const;
  /// Canonical name for a name or alias; throws c10::ValueError "unknown
  /// strategy 'x'; available: ..." when unknown.
  std::string resolve(const std::string& name) const;
  /// The spec of a name or alias (throws like resolve()).
  const StrategySpec& spec(const std::string& name) const;
  /// Every spec, in registration order.
  std::vector<const StrategySpec*> specs() const;

  /// Builds `name` with its options given as text (key -> value, as on the
  /// command line; the rest default). Throws c10::ValueError for an unknown
  /// name or a bad option.
  std::unique_ptr<Strategy> create(const std::string& name, Comm comm,
                                   const std::map<std::string, std::string>& options = {},
                                   const StrategyContext& context = {}) const;
  /// The same from options already parsed (StrategySpec::parse_args).
  std::unique_ptr<Strategy> create_parsed(const std::string& name, Comm comm, const StrategyArgs& args,
                                          const StrategyContext& context) const;

  /// "single, ddp, oss (zero1), ..." for error messages and --help.
  std::string available() const;
  /// Names and aliases.
  std::vector<std::string> names() const;
  std::string description(const std::string& name) const;

  /// Names (with their aliases) of the specs that declare option `key`:
  /// "ddp, oss (zero1) and sdp (zero2)"; "" when none does.
  std::string declared_by(const std::string& key) const;
  /// Every option key any spec declares, each once (the first declaration),
  /// in registration order.
  std::vector<const StrategyOption*> all_options() const;

  /// The reference spec (StrategySpec::reference), or null.
  const StrategySpec* reference() const;
  /// The first spec that runs one process only (max_world_size 1), or null.
  const StrategySpec* single_process() const;

 private:
  std::string with_aliases(const StrategySpec& spec) const;

  std::deque<StrategySpec> specs_;  ///< registration order (deque: pointers stay valid)
  std::map<std::string, size_t> index_;  ///< names and aliases -> specs_ index
};

/// Registers the built-ins, each from its own folder: single, ddp, oss
/// (zero1), sdp (zero2), fsdp (zero3).
void register_builtin_strategies(StrategyRegistry& registry);

}  // namespace strata
