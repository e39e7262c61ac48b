#include "strata/strategies/registry.h"

#include "strata/strategies/ddp/ddp.h"
#include "strata/strategies/fsdp/fully_sharded.h"
#include "strata/strategies/oss/oss.h"
#include "strata/strategies/sdp/sdp.h"
#include "strata/strategies/single/single_device.h"

#include <sstream>

namespace strata {

void StrategyRegistry::add(StrategySpec spec) {
  TORCH_CHECK(!spec.name().empty(), "a strategy spec needs a name");
  TORCH_CHECK(spec.factory() != nullptr, "strategy '", spec.name(), "' has no factory");
  std::vector<std::string> names = {spec.name()};
  names.insert(names.end(), spec.aliases().begin(), spec.aliases().end());
  for (size_t i = 0; i < names.size(); ++i) {
    TORCH_CHECK(!contains(names[i]), "strategy '", names[i], "' is already registered");
    for (size_t j = 0; j < i; ++j) {
      TORCH_CHECK(names[j] != names[i], "strategy '", spec.name(), "' names '", names[i], "' twice");
    }
  }
  for (size_t i = 0; i < spec.options().size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      TORCH_CHECK(spec.options()[j].key() != spec.options()[i].key(), "strategy '", spec.name(),
                  "' declares option '", spec.options()[i].key(), "' twice");
    }
  }
  TORCH_CHECK(!spec.reference() || reference() == nullptr, "strategy '", spec.name(),
              "' is the reference, but '", reference() ? reference()->name() : "", "' already is");
  for (const auto& option : spec.options()) {
    // One key, one meaning: the command line has one --key for every spec.
    for (const auto* other : all_options()) {
      if (other->key() != option.key()) continue;
      const auto described = [](const StrategyOption& o) {
        return std::string(option_kind_name(o.kind())) + " default " + option_text(o.default_value()) +
               (o.bare() ? " (bare --key means true)" : "");
      };
      TORCH_CHECK(described(*other) == described(option), "strategy '", spec.name(), "' declares option '",
                  option.key(), "' as ", described(option), ", but ", declared_by(option.key()), " declare it as ",
                  described(*other));
    }
  }
  const size_t at = specs_.size();
  specs_.push_back(std::move(spec));
  for (const auto& name : names) index_.emplace(name, at);
}

bool StrategyRegistry::contains(const std::string& name) const { return index_.count(name) == 1; }

std::string StrategyRegistry::resolve(const std::string& name) const { return spec(name).name(); }

const StrategySpec& StrategyRegistry::spec(const std::string& name) const {
  const auto it = index_.find(name);
  TORCH_CHECK_VALUE(it != index_.end(), "unknown strategy '", name, "'; available: ", available());
  return specs_[it->second];
}

std::vector<const StrategySpec*> StrategyRegistry::specs() const {
  std::vector<const StrategySpec*> out;
  for (const auto& s : specs_) out.push_back(&s);
  return out;
}

std::unique_ptr<Strategy> StrategyRegistry::create(const std::string& name, Comm comm,
                                                   const std::map<std::string, std::string>& options,
                                                   const StrategyContext& context) const {
  return create_parsed(name, std::move(comm), spec(name).parse_args(options), context);
}

std::unique_ptr<Strategy> StrategyRegistry::create_parsed(const std::string& name, Comm comm, const StrategyArgs& args,
                                                          const StrategyContext& context) const {
  StrategyContext resolved = context;
  if (resolved.world_size == 0) resolved.world_size = comm.size();
  TORCH_CHECK_VALUE(resolved.world_size == comm.size(), "strategy '", name, "': the context's world size ",
                    resolved.world_size, " is not the Comm's ", comm.size());
  return spec(name).factory()(std::move(comm), args, resolved);
}

std::string StrategyRegistry::with_aliases(const StrategySpec& s) const {
  std::string out = s.name();
  if (!s.aliases().empty()) {
    out += " (";
    for (size_t i = 0; i < s.aliases().size(); ++i) out += (i ? ", " : "") + s.aliases()[i];
    out += ")";
  }
  return out;
}

std::string StrategyRegistry::available() const {
  std::ostringstream out;
  for (size_t i = 0; i < specs_.size(); ++i) out << (i > 0 ? ", " : "") << with_aliases(specs_[i]);
  return out.str();
}

std::vector<std::string> StrategyRegistry::names() const {
  std::vector<std::string> all;
  for (const auto& s : specs_) all.push_back(s.name());
  for (const auto& s : specs_) all.insert(all.end(), s.aliases().begin(), s.aliases().end());
  return all;
}

std::string StrategyRegistry::description(const std::string& name) const { return spec(name).description(); }

std::string StrategyRegistry::declared_by(const std::string& key) const {
  std::vector<std::string> who;
  for (const auto& s : specs_) {
    if (s.find_option(key) != nullptr) who.push_back(with_aliases(s));
  }
  std::string out;
  for (size_t i = 0; i < who.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == who.size() ? " and " : ", ") + who[i];
  }
  return who.size() == 1 ? out + " only" : out;
}

std::vector<const StrategyOption*> StrategyRegistry::all_options() const {
  std::vector<const StrategyOption*> out;
  for (const auto& s : specs_) {
    for (const auto& option : s.options()) {
      bool seen = false;
      for (const auto* o : out) seen = seen || o->key() == option.key();
      if (!seen) out.push_back(&option);
    }
  }
  return out;
}

const StrategySpec* StrategyRegistry::reference() const {
  for (const auto& s : specs_) {
    if (s.reference()) return &s;
  }
  return nullptr;
}

const StrategySpec* StrategyRegistry::single_process() const {
  for (const auto& s : specs_) {
    if (s.max_world_size() == 1) return &s;
  }
  return nullptr;
}

void register_builtin_strategies(StrategyRegistry& registry) {
  registry.add(single_device_spec());
  registry.add(ddp_spec());
  registry.add(oss_spec());
  registry.add(sdp_spec());
  registry.add(fsdp_spec());
}

}  // namespace strata
