// The helpers both --config translations share (foreign_config.h, namespace
// foreign): typed reads of a config's values, each failing with one line that
// names the file and the key, and the registered strategy a DeepSpeed stage or
// an Accelerate distributed_type stands for.
#include "strata/recipes/config/foreign_config.h"

#include <charconv>
#include <cmath>
#include <stdexcept>

namespace strata::recipes {

using nlohmann::json;

namespace foreign {

void fail(const std::string& file, const std::string& key, const std::string& what) {
  throw std::invalid_argument(file + ": " + key + " " + what);
}

bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

std::string text(const json& v, const std::string& file, const std::string& key) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) {
    char buf[64];  // the shortest text that reads back as the same double ("0.8", not "0.80000000000000004")
    return std::string(buf, std::to_chars(buf, buf + sizeof(buf), v.get<double>()).ptr);
  }
  fail(file, key, "is " + v.dump() + "; expected a number, a string or true/false");
}

int64_t whole(const json& v, const std::string& file, const std::string& key) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number() && std::floor(v.get<double>()) == v.get<double>() && std::abs(v.get<double>()) < 9e18) {
    return static_cast<int64_t>(v.get<double>());
  }
  fail(file, key, "is " + v.dump() + "; expected a whole number");
}

bool boolean(const json& v, const std::string& file, const std::string& key) {
  if (!v.is_boolean()) fail(file, key, "is " + v.dump() + "; expected true or false");
  return v.get<bool>();
}

std::string string(const json& v, const std::string& file, const std::string& key) {
  if (!v.is_string()) fail(file, key, "is " + v.dump() + "; expected a string");
  return v.get<std::string>();
}

const json& object(const json& v, const std::string& file, const std::string& key) {
  static const json empty = json::object();
  if (v.is_null()) return empty;
  if (!v.is_object()) fail(file, key, "is " + v.dump() + "; expected a block of keys");
  return v;
}

std::string join_key(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

std::string zero_stage_strategy(const StrategyRegistry& strategies, int64_t stage, const std::string& file,
                                const std::string& key) {
  std::string mapped;
  for (const auto* spec : strategies.specs()) {
    if (spec->deepspeed_zero_stage() < 0) continue;
    if (spec->deepspeed_zero_stage() == stage) return spec->name();
    mapped += (mapped.empty() ? "" : ", ") + std::to_string(spec->deepspeed_zero_stage()) + " (" + spec->name() + ")";
  }
  fail(file, key, std::to_string(stage) + " is not a ZeRO stage strata maps; it maps " + (mapped.empty() ? "none" : mapped));
}

std::string accelerate_strategy(const StrategyRegistry& strategies, const std::string& type) {
  for (const auto* spec : strategies.specs()) {
    for (const auto& t : spec->accelerate_types()) {
      if (t == type) return spec->name();
    }
  }
  return "";
}

}  // namespace foreign

}  // namespace strata::recipes
