#include "strata/strategies/spec.h"

#include "strata/strategies/offload_tier.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

namespace strata {

namespace {

std::string shortest(double v) {
  char buf[64];  // the shortest text that reads back as the same double
  return std::string(buf, std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::general).ptr);
}

std::string join(const std::vector<std::string>& items) { return c10::Join(", ", items); }

const char* kind_word(OptionKind kind) {
  switch (kind) {
    case OptionKind::kBool: return "true/false";
    case OptionKind::kInt: return "an integer";
    case OptionKind::kReal: return "a number";
    case OptionKind::kText: return "text";
  }
  return "?";
}

}  // namespace

const char* option_kind_name(OptionKind kind) {
  switch (kind) {
    case OptionKind::kBool: return "BOOL";
    case OptionKind::kInt: return "INT";
    case OptionKind::kReal: return "FLOAT";
    case OptionKind::kText: return "STR";
  }
  return "STR";
}

std::string option_text(const OptionValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
        else if constexpr (std::is_same_v<T, int64_t>) return std::to_string(v);
        else if constexpr (std::is_same_v<T, double>) return shortest(v);
        else return v;
      },
      value);
}

std::string parse_bool_text(const std::string& s, bool& out) {
  if (s == "true" || s == "1" || s == "yes" || s == "on") {
    out = true;
  } else if (s == "false" || s == "0" || s == "no" || s == "off") {
    out = false;
  } else {
    return "expected true/false, 1/0 or yes/no";
  }
  return "";
}

std::string parse_real_text(const std::string& s, double& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(out)) return "expected a number";
  return "";
}

// ---- StrategyOption -----------------------------------------------------------

StrategyOption::StrategyOption(std::string key, OptionKind kind, OptionValue default_value, std::string help)
    : key_(std::move(key)), kind_(kind), default_(std::move(default_value)), help_(std::move(help)) {
  TORCH_CHECK(!key_.empty() && key_.find_first_of(" =,") == std::string::npos,
              "strategy option key '", key_, "' must be non-empty, without spaces, '=' or ','");
}

StrategyOption StrategyOption::boolean(std::string key, bool default_value, std::string help, bool bare) {
  StrategyOption o(std::move(key), OptionKind::kBool, default_value, std::move(help));
  o.bare_ = bare;
  return o;
}

StrategyOption StrategyOption::integer(std::string key, int64_t default_value, std::string help) {
  return StrategyOption(std::move(key), OptionKind::kInt, default_value, std::move(help));
}

StrategyOption StrategyOption::real(std::string key, double default_value, std::string help) {
  return StrategyOption(std::move(key), OptionKind::kReal, default_value, std::move(help));
}

StrategyOption StrategyOption::choice(std::string key, std::string default_value, std::vector<std::string> choices,
                                      std::string help) {
  TORCH_CHECK(std::find(choices.begin(), choices.end(), default_value) != choices.end(), "strategy option '", key,
              "': default '", default_value, "' is not one of its choices ", join(choices));
  StrategyOption o(std::move(key), OptionKind::kText, std::move(default_value), std::move(help));
  o.choices_ = std::move(choices);
  return o;
}

StrategyOption StrategyOption::text(std::string key, std::string default_value, std::string help) {
  return StrategyOption(std::move(key), OptionKind::kText, std::move(default_value), std::move(help));
}

StrategyOption& StrategyOption::at_least(double min) {
  TORCH_CHECK(kind_ == OptionKind::kInt || kind_ == OptionKind::kReal, "strategy option '", key_,
              "': a lower bound needs a number");
  min_ = min;
  min_exclusive_ = false;
  return *this;
}

StrategyOption& StrategyOption::above(double min) {
  at_least(min);
  min_exclusive_ = true;
  return *this;
}

StrategyOption& StrategyOption::below(double max) {
  TORCH_CHECK(kind_ == OptionKind::kInt || kind_ == OptionKind::kReal, "strategy option '", key_,
              "': an upper bound needs a number");
  max_ = max;
  return *this;
}

std::string StrategyOption::rule() const {
  if (!choices_.empty()) return "one of " + join(choices_);
  if (min_ && max_) return std::string(min_exclusive_ ? "in (" : "in [") + shortest(*min_) + ", " + shortest(*max_) + ")";
  if (min_) return std::string(min_exclusive_ ? "> " : ">= ") + shortest(*min_);
  if (max_) return "< " + shortest(*max_);
  return "";
}

std::string StrategyOption::parse(const std::string& s, OptionValue& out) const {
  switch (kind_) {
    case OptionKind::kBool: {
      bool v = false;
      const std::string expected = parse_bool_text(s, v);
      if (expected.empty()) out = v;
      return expected;
    }
    case OptionKind::kInt: {
      int64_t v = 0;
      auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec == std::errc::result_out_of_range) return "expected an integer that fits 64 bits";
      if (ec != std::errc() || end != s.data() + s.size()) return "expected an integer";
      out = v;
      return "";
    }
    case OptionKind::kReal: {
      double v = 0;
      const std::string expected = parse_real_text(s, v);
      if (expected.empty()) out = v;
      return expected;
    }
    case OptionKind::kText:
      out = s;
      return "";
  }
  return "expected " + std::string(kind_word(kind_));
}

std::string StrategyOption::check(const OptionValue& value) const {
  if (!choices_.empty()) {
    const auto* text = std::get_if<std::string>(&value);
    if (text == nullptr || std::find(choices_.begin(), choices_.end(), *text) == choices_.end()) return rule();
  }
  if (min_) {
    const double v = std::holds_alternative<int64_t>(value)  ? static_cast<double>(std::get<int64_t>(value))
                     : std::holds_alternative<double>(value) ? std::get<double>(value)
                                                             : std::numeric_limits<double>::quiet_NaN();
    if (!(min_exclusive_ ? v > *min_ : v >= *min_)) return "must be " + rule();
  }
  if (max_) {
    const double v = std::holds_alternative<int64_t>(value)  ? static_cast<double>(std::get<int64_t>(value))
                     : std::holds_alternative<double>(value) ? std::get<double>(value)
                                                             : std::numeric_limits<double>::quiet_NaN();
    if (!(v < *max_)) return "must be " + rule();
  }
  return "";
}

// ---- StrategyArgs ---------------------------------------------------------------

const OptionValue& StrategyArgs::at(const std::string& key) const {
  const auto it = values_.find(key);
  TORCH_CHECK(it != values_.end(), "strategy option '", key, "' is not declared by this strategy's spec");
  return it->second;
}

bool StrategyArgs::boolean(const std::string& key) const {
  const auto* v = std::get_if<bool>(&at(key));
  TORCH_CHECK(v != nullptr, "strategy option '", key, "' is not a bool");
  return *v;
}

int64_t StrategyArgs::integer(const std::string& key) const {
  const auto* v = std::get_if<int64_t>(&at(key));
  TORCH_CHECK(v != nullptr, "strategy option '", key, "' is not an integer");
  return *v;
}

double StrategyArgs::real(const std::string& key) const {
  const auto& value = at(key);
  if (const auto* i = std::get_if<int64_t>(&value)) return static_cast<double>(*i);
  const auto* v = std::get_if<double>(&value);
  TORCH_CHECK(v != nullptr, "strategy option '", key, "' is not a number");
  return *v;
}

const std::string& StrategyArgs::text(const std::string& key) const {
  const auto* v = std::get_if<std::string>(&at(key));
  TORCH_CHECK(v != nullptr, "strategy option '", key, "' is not text");
  return *v;
}

void StrategyArgs::set(const std::string& key, OptionValue value, bool given) {
  values_[key] = std::move(value);
  if (given) given_.insert(key);
}

// ---- StrategySpec ---------------------------------------------------------------

double CommEstimate::total() const {
  double sum = 0;
  for (const auto& [kind, b] : bytes) sum += b;
  return sum;
}

const StrategyOption* StrategySpec::find_option(const std::string& key) const {
  for (const auto& option : options_) {
    if (option.key() == key) return &option;
  }
  return nullptr;
}

StrategyArgs StrategySpec::parse_args(const std::map<std::string, std::string>& given) const {
  StrategyArgs args;
  for (const auto& option : options_) args.set(option.key(), option.default_value(), false);
  for (const auto& [key, text] : given) {
    const StrategyOption* option = find_option(key);
    if (option == nullptr) {
      std::vector<std::string> keys;
      for (const auto& o : options_) keys.push_back(o.key());
      TORCH_CHECK_VALUE(false, "strategy '", name_, "' has no option '", key, "'",
                        keys.empty() ? std::string("; it takes none") : "; its options: " + join(keys));
    }
    OptionValue value;
    const std::string expected = option->parse(text, value);
    TORCH_CHECK_VALUE(expected.empty(), "invalid value '", text, "' for --", key, ": ", expected);
    const std::string broken = option->check(value);
    TORCH_CHECK_VALUE(broken.empty(), "invalid value '", text, "' for --", key, ": ",
                      option->choices().empty() ? broken : "allowed: " + join(option->choices()),
                      option->choices().empty() ? " for strategy '" + name_ + "'" : std::string());
    args.set(key, value, true);
  }
  if (validate_) {
    const std::string error = validate_(args);
    TORCH_CHECK_VALUE(error.empty(), error);
  }
  return args;
}

std::string StrategySpec::check_run(const StrategyArgs& args, const StrategyContext& context) const {
  if (!check_) return "";
  try {
    return check_(args, context);
  } catch (const c10::Error& e) {  // checks may use the strategies' own TORCH_CHECK_VALUEs
    return e.what_without_backtrace();
  }
}

// ---- Shared models --------------------------------------------------------------

std::optional<MemoryEstimate> replicated_memory(const MemoryQuery& q) {
  MemoryEstimate m;
  m.params = 4 * q.model.params;
  m.grads = 4 * q.model.trainable;
  m.optimizer = q.optimizer_bytes_per_param * q.model.trainable;
  return with_optimizer_offload(m, q);
}

MemoryEstimate with_optimizer_offload(MemoryEstimate m, const MemoryQuery& q) {
  if (q.offload == "none") return m;
  m.offloaded = m.optimizer;
  m.optimizer = 0;
  return m;
}

std::unique_ptr<Strategy> offload_optimizer_state_as_asked(std::unique_ptr<Strategy> strategy,
                                                           const StrategyContext& context) {
  const OffloadKind kind = parse_offload(context.offload);
  if (kind == OffloadKind::kNone) return strategy;
  check_offload_kind(kind, context.offload_dir, strategy->device());
  strategy->offload_optimizer_state(make_offload_tier(kind, context.offload_dir), kDefaultOffloadChunkNumel);
  return strategy;
}

std::string optimizer_offload_problem(const StrategyArgs&, const StrategyContext& context) {
  try {
    check_offload_kind(parse_offload(context.offload), context.offload_dir, context.device);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace strata
