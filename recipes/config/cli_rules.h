#pragma once
// The rules parse_run_config() checks once a config is assembled (recipes/
// cli.cpp parses, this file judges): choices, combinations that would be
// ignored or contradict each other, and value ranges. Internal to the recipes
// library; every message is one line naming the key, the value and what is
// allowed.
#include "strata/recipes/config/cli.h"

#include <charconv>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace strata::recipes {

std::vector<std::string> optimizer_names();
std::vector<std::string> precision_names();

/// When `key` is a strategy option (some registered spec declares it) that
/// `strategy` (a name, alias or "auto") does not read: who does ("fsdp
/// (zero3) only", "ddp, oss (zero1) and sdp (zero2)"). nullopt otherwise.
std::optional<std::string> strategy_ignores(const std::string& key, const std::string& strategy,
                                            const StrategyRegistry& strategies);

/// Why `data` does not read the data-shape option `key` ("block-size",
/// "vocab-size"): addition samples have their own length and vocabulary, a
/// text file its 256 byte values. nullopt when it reads it.
std::optional<std::string> data_ignores(const std::string& key, const std::string& data);

/// Why `c` does not read the loss-scaling option `key`: they are for 16-mixed
/// only (bf16 and fp32 have the range and need no scaler), and the dynamic
/// ones not with a static --loss-scale. nullopt when it reads it.
std::optional<std::string> precision_ignores(const std::string& key, const RunConfig& c);

/// Keys given explicitly (not defaulted), each with where it was given: "" for
/// the command line, "config file 'x': " for --config.
using GivenKeys = std::map<std::string, std::string>;

/// "" or the first rule `c` breaks.
std::string validate(const RunConfig& c, const ModelKeys& models, const StrategyRegistry& strategies,
                     const GivenKeys& given);

/// Whether the run trains no LoRA adapters (no --lora-rank, or 0): the
/// families' LoRA options (recipes/models/spec.h lora_options) then go unread.
bool lora_off(const RunConfig& c);

std::string join(const std::vector<std::string>& items);

inline std::string format(const std::string& v) { return v; }
inline std::string format(bool v) { return v ? "true" : "false"; }
inline std::string format(double v) {
  char buf[64];  // the shortest text that reads back as the same double
  return std::string(buf, std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::general).ptr);
}
template <typename Int, typename = std::enable_if_t<std::is_integral_v<Int>>>
std::string format(Int v) { return std::to_string(v); }

}  // namespace strata::recipes
