#include "strata/recipes/config/cli.h"

#include "strata/core/file_text.h"
#include "strata/recipes/config/foreign_config.h"

#include "strata/recipes/config/cli_fields.h"
#include "strata/recipes/config/cli_rules.h"

#include <c10/util/StringUtil.h>
#include <boost/program_options.hpp>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>
#include <variant>

namespace strata::recipes {
namespace {

namespace po = boost::program_options;

// Boost parses the tokens (command line and INI) and prints --help; the values
// are kept as text and converted here, so that every error can name the key,
// the offending value and what is allowed, and so the command line can simply
// be applied after the config file (last write wins).

/// Each parse_text returns "" on success, else what was expected.
std::string parse_text(const std::string& s, std::string& out) {
  out = s;
  return "";
}
std::string parse_text(const std::string& s, bool& out) { return parse_bool_text(s, out); }
std::string parse_text(const std::string& s, double& out) { return parse_real_text(s, out); }
template <typename Int, typename = std::enable_if_t<std::is_integral_v<Int>>>
std::string parse_text(const std::string& s, Int& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec == std::errc::result_out_of_range) {
    return "expected an integer from " + format(std::numeric_limits<Int>::min()) + " to " +
           format(std::numeric_limits<Int>::max());
  }
  if (ec != std::errc() || end != s.data() + s.size()) {
    return std::is_signed_v<Int> ? "expected an integer" : "expected a non-negative integer";
  }
  return "";
}

const char* value_name(const Member& m) {
  constexpr const char* names[] = {"STR", "INT", "INT", "INT", "FLOAT", "BOOL"};
  return names[m.index()];
}

/// One key of the command line and the INI file: a RunConfig field, a
/// registered strategy's option (stored in RunConfig::strategy_options) or a
/// model family's (RunConfig::model_options).
struct Entry {
  std::string key;
  int group = 0;
  std::string help;
  bool flag = false;
  std::optional<Field> field;               ///< a RunConfig member
  const StrategyOption* option = nullptr;   ///< a strategy or model option (its first declaration)
  const ModelKey* model = nullptr;          ///< a model family's option: every declaration of it
};


/// "" or why `models` and `strategies` cannot be strata-gpt's: a strategy
/// named auto (the planner's), or an option key strata-gpt has itself (--lr,
/// --momentum) or both a strategy and a model family declare: one of the two
/// would never get its value.
std::string registry_conflict(const ModelKeys& models, const StrategyRegistry& strategies) {
  if (strategies.contains("auto")) {
    return "strategy '" + strategies.resolve("auto") + "' is registered as 'auto', which is --strategy auto (the "
           "memory planner's choice); rename it";
  }
  for (const Field& f : fields()) {
    const std::string who = strategies.declared_by(f.key);
    if (!who.empty()) {
      return "strategy option '--" + std::string(f.key) + "' (declared by " + who +
             ") is one of strata-gpt's own options; give the strategy's option another key";
    }
  }
  const std::vector<Field> own_fields = fields();
  for (const ModelKey& m : models.options) {
    const std::string& key = m.option.key();
    const bool own = std::any_of(own_fields.begin(), own_fields.end(), [&](const Field& f) { return key == f.key; });
    const std::string strategy = strategies.declared_by(key);
    if (own || !strategy.empty()) {
      return "model option '--" + key + "' (declared by " + join(m.families) + ") is " +
             (own ? "one of strata-gpt's own options" : "strategy " + strategy + "'s option") +
             "; give the model's option another key";
    }
  }
  return "";
}

/// Every key, in --help and to_ini() order: the model families' options
/// after kModelOptionsAfter, the strategies' after kStrategyOptionsAfter.
std::vector<Entry> entries(const ModelKeys& models, const StrategyRegistry& strategies) {
  std::vector<Entry> out;
  for (Field& f : fields()) {
    out.push_back({f.key, f.group, f.help, f.flag, f, nullptr});
    if (std::string(f.key) == kModelOptionsAfter) {
      for (const ModelKey& m : models.options) {
        out.push_back({m.option.key(), f.group, c10::str("[", join(m.families), "] ", m.help), m.option.bare(),
                       std::nullopt, &m.option, &m});
      }
    }
    if (std::string(f.key) != kStrategyOptionsAfter) continue;
    for (const StrategyOption* o : strategies.all_options()) {
      out.push_back({o->key(), f.group, c10::str("[", strategies.declared_by(o->key()), "] ", o->help()), o->bare(), std::nullopt, o});
    }
  }
  return out;
}

/// The entry's value in `config` as command-line / INI text.
std::string text_of(const RunConfig& config, const Entry& e) {
  if (e.field) return std::visit([&](auto member) { return format(config.*member); }, e.field->member);
  const auto& given = e.model ? config.model_options : config.strategy_options;
  const auto it = given.find(e.key);
  return it != given.end() ? it->second : option_text(e.option->default_value());
}

/// Sets `key` from `text`; returns "" or the one-line error (`where` prefixes it).
std::string apply(RunConfig& config, const std::vector<Entry>& all, const std::string& key, const std::string& text,
                  const std::string& where) {
  for (const Entry& e : all) {
    if (key != e.key) continue;
    std::string expected;
    if (e.field) {
      expected = std::visit([&](auto member) { return parse_text(text, config.*member); }, e.field->member);
    } else {
      OptionValue value;
      expected = e.option->parse(text, value);
      // A model value no declaring family accepts is refused here; the
      // family that resolves the model checks its own rule (models/spec.cpp).
      if (expected.empty() && e.model != nullptr &&
          std::none_of(e.model->declared.begin(), e.model->declared.end(),
                       [&](const StrategyOption& o) { return o.check(value).empty(); })) {
        expected = e.option->check(value);
      }
      if (expected.empty()) (e.model ? config.model_options : config.strategy_options)[key] = option_text(value);
    }
    if (expected.empty()) return "";
    return where + "invalid value '" + text + "' for " + (where.empty() ? "--" : "") + key + ": " + expected;
  }
  return where + "unknown key '" + key + "'";  // not reached: Boost rejects unknown keys first
}

/// The option groups (testing aids last); defaults and choices appear in --help.
std::vector<po::options_description> option_groups(const ModelKeys& models, const std::vector<Entry>& all,
                                                   const StrategyRegistry& strategies) {
  RunConfig defaults;  // shown in --help only: values are applied by apply()
  defaults.preset = models.default_preset;
  std::vector<po::options_description> groups;
  for (const auto& title : group_titles()) {
    groups.emplace_back(static_cast<int>(groups.size()) == kTestingGroup
                            ? title + " (strata's own tests; listed by --help-all only)"
                            : title + " options");
  }
  for (const Entry& e : all) {
    auto* value = po::value<std::string>()->value_name(e.field ? value_name(e.field->member)
                                                               : option_kind_name(e.option->kind()));
    if (const std::string text = text_of(defaults, e); !text.empty()) value->default_value(text);
    if (e.flag) value->implicit_value("true");
    std::string help = e.help;
    if (e.key == "preset" && !models.presets.empty()) help += ": " + join(models.presets);
    if (e.key == "strategy") help += ": " + strategies.available() + ", auto (the memory planner picks)";
    groups[e.group].add_options()(e.key.c_str(), value, help.c_str());
  }
  return groups;
}

ParseResult failure(std::string message) { return {std::nullopt, 2, std::move(message)}; }

/// Reads --config FILE into `config` and records its keys in `given`; returns
/// "" or the one-line error.
std::string apply_foreign_config(const std::string& path, const std::vector<Entry>& all,
                                 const StrategyRegistry& strategies, RunConfig& config, GivenKeys& given) {
  ForeignConfig foreign;
  try {
    foreign = read_foreign_config(path, strategies);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  const std::string where = "config file '" + path + "': ";
  for (const auto& [key, value] : foreign.keys) {
    // A translation may set a key twice (a scheduler's lr after the
    // optimizer's): the later, more specific one wins.
    const std::string error = apply(config, all, key, value, where);
    if (!error.empty()) return error;
    given[key] = where;
  }
  config.offload_host_from_config = foreign.host_offload;
  config.config_global_batch = foreign.global_batch;
  if (!foreign.ignored.empty()) {
    config.config_notes.push_back(where + "accepted without effect (strata sizes or does these itself): " +
                                  join(foreign.ignored));
  }
  return "";
}

std::string apply_config_file(const std::string& path, const po::options_description& desc,
                              const std::vector<Entry>& all, const StrategyRegistry& strategies, RunConfig& config,
                              GivenKeys& given) {
  const std::string where = "config file '" + path + "': ";
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return "cannot read " + where + "is a directory";
  if (is_foreign_config(path)) return apply_foreign_config(path, all, strategies, config, given);
  std::istringstream in;
  try {
    in.str(read_file_capped(path, kMaxConfigFileBytes, "config file"));
  } catch (const c10::ValueError& e) {
    return "config file " + std::string(e.what_without_backtrace());
  }
  po::parsed_options parsed(&desc);
  try {
    parsed = po::parse_config_file(in, desc, /*allow_unregistered=*/true);
  } catch (const po::invalid_config_file_syntax& e) {
    return where + "invalid line '" + control_escaped(e.tokens()) + "'; expected key = value";
  } catch (const po::error& e) {
    return where + control_escaped(e.what());
  }
  std::map<std::string, int> seen;
  for (const po::option& option : parsed.options) {
    // A key given twice is a mistake whichever value was meant (Boost would
    // keep both and the last would silently win).
    if (++seen[option.string_key] == 2) {
      return where + "key '" + option.string_key + "' is given twice; give it once";
    }
    if (option.unregistered) {
      std::vector<std::string> keys;
      for (const Entry& e : all) keys.push_back(e.key);
      return where + "unknown key '" + option.string_key + "'; valid keys: " + join(keys);
    }
    const std::string error = apply(config, all, option.string_key, option.value.at(0), where);
    if (!error.empty()) return error;
    given[option.string_key] = where;
  }
  return "";
}

/// boost's parse of the command line into `parsed`; "" or the one-line error.
std::string parse_command_line(const std::vector<std::string>& argv, const po::options_description& cli,
                               po::parsed_options& parsed) {
  try {
    const std::vector<std::string> args(argv.empty() ? argv.begin() : argv.begin() + 1, argv.end());
    parsed = po::command_line_parser(args)
                 .options(cli)
                 .style(po::command_line_style::default_style &
                        ~po::command_line_style::allow_guessing)
                 .run();
  } catch (const po::unknown_option& e) {
    return "unknown option '" + e.get_option_name() + "'; run with --help for the list of options";
  } catch (const po::invalid_command_line_syntax& e) {
    if (e.kind() == po::invalid_syntax::missing_parameter ||
        e.kind() == po::invalid_syntax::empty_adjacent_parameter) {
      return "missing value for " + e.get_option_name();
    }
    return std::string(e.what()) + "; run with --help for the list of options";
  } catch (const po::error& e) {  // e.g. --help=3
    return std::string(e.what()) + "; run with --help for the list of options";
  }
  return "";
}

/// --help (all = false: without the testing aids) or --help-all.
std::string usage_text(const po::options_description& general, const std::vector<po::options_description>& groups,
                       const StrategyRegistry& strategies, bool all) {
  std::ostringstream usage;
  usage << "Usage: strata-gpt [options]\n\n" << general;  // groups print aligned per group
  usage << "\nStrategies (--strategy):\n";
  for (const auto* spec : strategies.specs()) {
    std::string name = spec->name();
    for (const auto& alias : spec->aliases()) name += ", " + alias;
    usage << "  " << name << std::string(name.size() < 20 ? 22 - name.size() : 2, ' ') << spec->description()
          << (spec->max_world_size() == 1 ? " (one process)" : "") << '\n';
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    if (all || static_cast<int>(g) != kTestingGroup) usage << '\n' << groups[g];
  }
  if (all) usage << '\n' << kTestingEnvironment << '\n';
  std::string text = usage.str();
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

ParseResult parse(const std::vector<std::string>& argv, const ModelKeys& models,
                  const StrategyRegistry& strategies) {
  if (std::string conflict = registry_conflict(models, strategies); !conflict.empty()) return failure(conflict);
  const auto all = entries(models, strategies);
  const auto groups = option_groups(models, all, strategies);
  po::options_description general("General options");
  general.add_options()("help,h", "print this help and exit")(
      "help-all", "print every option, testing aids included, and exit")(
      "config", po::value<std::string>()->value_name("FILE"),
      "INI file with the same keys (key = value), a DeepSpeed config (.json) or an Accelerate "
      "config (.yaml, .yml), translated into these options; the command line wins");
  po::options_description cli, file;
  cli.add(general);
  for (const auto& group : groups) {
    cli.add(group);
    file.add(group);
  }

  po::parsed_options parsed(&cli);
  if (std::string error = parse_command_line(argv, cli, parsed); !error.empty()) return failure(error);

  std::optional<std::string> config_path;
  std::map<std::string, int> seen;
  for (const po::option& option : parsed.options) {
    // A repeated option is a mistake whichever value was meant: the last
    // would silently win.
    if (!option.string_key.empty() && ++seen[option.string_key] == 2) {
      return failure("--" + option.string_key + " is given twice; give it once");
    }
    if (option.string_key.empty() || option.position_key >= 0) {
      return failure("unexpected argument '" + option.original_tokens.at(0) +
                     "'; options are given as --key value");
    }
    if (option.string_key == "help" || option.string_key == "help-all") {
      const std::string text = usage_text(general, groups, strategies, option.string_key == "help-all");
      return {std::nullopt, 0, text};
    }
    if (option.string_key == "config") config_path = option.value.at(0);
  }

  RunConfig config;
  config.preset = models.default_preset;
  GivenKeys given;
  if (config_path) {
    const std::string error = apply_config_file(*config_path, file, all, strategies, config, given);
    if (!error.empty()) return failure(error);
  }
  for (const po::option& option : parsed.options) {
    if (option.string_key == "config") continue;
    // A bare flag (--progress-bar) arrives without tokens: its implicit value. Boost
    // takes "--progress-bar false" and "--lr -1" as key and value by itself.
    const std::string text = option.value.empty() ? "true" : option.value.front();
    const std::string error = apply(config, all, option.string_key, text, "");
    if (!error.empty()) return failure(error);
    given[option.string_key] = "";  // the command line wins: report it there
    if (option.string_key == "offload") config.offload_host_from_config = false;
  }
  config.batch_size_given = given.count("batch-size") != 0;
  config.accumulate_given = given.count("accumulate-grad-batches") != 0;
  for (const auto& item : given) config.given_keys.insert(item.first);
  if (std::string error = validate(config, models, strategies, given); !error.empty()) {
    return failure(error);
  }
  return {config, 0, ""};
}

}  // namespace

ParseResult parse_run_config(const std::vector<std::string>& argv, const ModelKeys& models,
                             const StrategyRegistry& strategies) {
  try {
    return parse(argv, models, strategies);
  } catch (const std::exception& e) {  // never throw: report whatever slipped through
    return failure(std::string("invalid arguments: ") + e.what());
  }
}

namespace {

/// Why config.ini comments `key` out (the run does not read it), or nullopt.
/// Commented out, the file stays valid as --config (a key that would be
/// ignored is an error there) and still says which knobs this run did not use.
std::optional<std::string> unread_because(const std::string& key, const RunConfig& config,
                                          const StrategyRegistry& strategies) {
  if (const auto who = strategy_ignores(key, config.strategy, strategies)) {
    return "not used by strategy '" + config.strategy + "'; it is for " + *who;
  }
  if ((key == "fused-adamw" || key == "adamw-kernel" || key.rfind("adam-", 0) == 0) && config.optimizer != "adamw") {
    return "not used by optimizer '" + config.optimizer + "'; it is for adamw";
  }
  if ((key == "momentum" || key == "nesterov") && config.optimizer != "sgd") {
    return "not used by optimizer '" + config.optimizer + "'; it is for sgd";
  }
  if (key == "adamw-kernel" && !config.fused_adamw) return std::string("not used with fused-adamw = false");
  if (config.model_unread.count(key) != 0) return "not used by the " + config.model_family + " family";
  if (!config.model_source.empty() && (key == "preset" || config.model_source_keys.count(key) != 0)) {
    return "given by init-from's config.json";
  }
  if (key == "init-std" && !config.init_from.empty()) return std::string("not used with init-from");
  // Defaults that adapt to the run (cli_rules.cpp): written as values they
  // would be "given" to a --config rerun, which refuses them.
  const bool defaulted = config.given_keys.count(key) == 0;
  if (key == "warmup-steps" && defaulted && config.warmup_steps > config.max_steps) {
    return "default; above max-steps " + std::to_string(config.max_steps) + ", the warm-up lasts the whole run";
  }
  if (key == "min-lr" && defaulted && config.min_lr > config.lr) return std::string("default; capped at lr");
  if (const auto why = data_ignores(key, config.data)) return "not read: " + *why;
  if (const auto why = precision_ignores(key, config)) return "not read: " + *why;
  if ((key == "lora-alpha" || key == "lora-targets") && lora_off(config)) {
    return std::string("not used without lora-rank");
  }
  if ((key == "checkpoint-mode" || key == "checkpoint-keep-best") && config.checkpoint_monitor.empty()) {
    return std::string("not used without checkpoint-monitor");
  }
  return std::nullopt;
}

}  // namespace

std::string to_ini(const RunConfig& config, const ModelKeys& models, const StrategyRegistry& strategies) {
  const auto titles = group_titles();
  std::ostringstream out;
  int group = -1;
  for (const Entry& e : entries(models, strategies)) {
    if (e.group != group) {
      out << (group < 0 ? "" : "\n") << "# " << titles[e.group] << '\n';
      group = e.group;
    }
    // A config made in code has no preset until parse_run_config sets the default.
    const std::string value = e.key == "preset" && config.preset.empty() ? models.default_preset : text_of(config, e);
    if (const auto why = unread_because(e.key, config, strategies)) {
      out << "# " << e.key << " = " << value << "  (" << *why << ")\n";
    } else {
      out << e.key << (value.empty() ? " =" : " = ") << value << '\n';
    }
  }
  return out.str();
}

StrategyArgs strategy_args(const RunConfig& config, const StrategyRegistry& strategies) {
  return strategies.spec(config.strategy).parse_args(config.strategy_options);
}

}  // namespace strata::recipes
