#include "recipes/cli.h"

#include "recipes/cli_rules.h"

#include <boost/program_options.hpp>

#include <cerrno>
#include <charconv>
#include <cmath>
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

using Member = std::variant<std::string RunConfig::*, int64_t RunConfig::*, int RunConfig::*,
                            uint64_t RunConfig::*, double RunConfig::*, bool RunConfig::*>;

/// One option: the same key on the command line (--key) and in the INI file.
struct Field {
  const char* key;
  int group;  ///< index into group_titles()
  Member member;
  const char* help;
  bool flag = false;  ///< bool that may be given bare (--key means true)
};

std::vector<std::string> group_titles() {
  return {"Model", "Data", "Strategy and launch", "Optimisation", "Loop and outputs", "Python interop",
          "Testing aids"};
}

/// The group --help leaves out (--help-all shows it): switches strata's own
/// tests use, shipped in the binary but not meant for training runs.
constexpr int kTestingGroup = 6;
constexpr int kInteropGroup = 5;

/// Printed by --help-all after the testing options: fault injection read from
/// the environment (recipes/run.cpp, trainer/checkpoint.cpp, strategies/offload_tier.cpp).
constexpr const char* kTestingEnvironment =
    "Testing aids in the environment:\n"
    "  STRATA_TEST_FAIL_AT_STEP=S    rank R throws at the start of step S\n"
    "  STRATA_TEST_FAIL_RANK=R       (default 0; failure-handling tests)\n"
    "  STRATA_CHECKPOINT_KILL_AT=P[@R][/S]  the process SIGKILLs itself at checkpoint point P\n"
    "                                (after-shard, before-metadata, before-rename), on rank R,\n"
    "                                at step S (crash-consistency tests; trainer/checkpoint.h)\n"
    "  STRATA_TEST_OFFLOAD_NO_TMPFILE=1  --offload disk uses its named-file fallback, as on a\n"
    "                                filesystem without O_TMPFILE (strategies/offload_tier.cpp)";

/// Model and data options (groups 0, 1).
std::vector<Field> model_data_fields() {
  using C = RunConfig;
  return {
      {"preset", 0, &C::preset, "model preset"},
      {"n-layer", 0, &C::n_layer, "transformer blocks (0: the preset's)"},
      {"n-head", 0, &C::n_head, "attention heads (0: the preset's)"},
      {"n-embd", 0, &C::n_embd, "embedding width (0: the preset's)"},
      {"block-size", 0, &C::block_size, "context length (0: the data's natural length)"},
      {"dropout", 0, &C::dropout, "dropout probability (< 0: the preset's)"},
      {"bias", 0, &C::bias, "biases in Linear layers (nanoGPT's default: true)"},
      {"attention", 0, &C::attention,
       "attention core: fused (strata's tiled CPU kernel, O(B·H·T) kept for backward; on CUDA "
       "LibTorch's SDPA), sdpa (LibTorch's scaled_dot_product_attention on any device) or naive "
       "(the reference: B×H×T×T scores)"},
      {"data", 1, &C::data, "addition, addition:N, a text file, or a dir with train.bin/val.bin"},
      {"vocab-size", 1, &C::vocab_size, "vocabulary size (nanoGPT .bin data only)"},
  };
}

/// Strategy and launch options (group 2).
std::vector<Field> launch_fields() {
  using C = RunConfig;
  return {
      {"strategy", 2, &C::strategy, "distributed strategy"},
      {"device", 2, &C::device, "auto (cuda:LOCAL_RANK when CUDA is usable, else cpu), cpu or cuda"},
      {"nproc", 2, &C::nproc, "ranks to launch on this machine"},
      {"nnodes", 2, &C::nnodes, "machines, each running strata-gpt with the same flags but --node-rank"},
      {"node-rank", 2, &C::node_rank, "this machine's index in [0, nnodes); node 0 hosts rank 0"},
      {"threads-per-rank", 2, &C::threads_per_rank, "intra-op threads per rank (0: cores / ranks)"},
      {"master-addr", 2, &C::master_addr, "node 0's address (one machine: Gloo binds to the interface that reaches it)"},
      {"master-port", 2, &C::master_port, "rank 0's store port with --nnodes > 1 (one machine meets in a file, no port)"},
      {"comm-timeout", 2, &C::comm_timeout_s, "collective timeout in seconds"},
      {"bucket-cap-mb", 2, &C::bucket_cap_mb,
       "gradient bucket size in MiB (ddp: 0 = one all-reduce per gradient)"},
      {"find-unused-parameters", 2, &C::find_unused_parameters,
       "ddp/oss/sdp/fsdp: a parameter without a gradient counts as zero (else an error)", true},
      {"overlap-comm", 2, &C::overlap_comm, "overlap gradient communication with backward"},
      {"sharding-strategy", 2, &C::sharding_strategy,
       "fsdp: full_shard (params, grads, optimizer state), shard_grad_op (keep units gathered "
       "from forward to backward), no_shard (DDP-like), hybrid_shard (full_shard inside a node of "
       "--nproc / LOCAL_WORLD_SIZE ranks, replicated across nodes)"},
      {"reshard-after-forward", 2, &C::reshard_after_forward,
       "fsdp: free a unit's full parameters after its forward: auto (the sharding strategy's), "
       "true, false"},
      {"limit-all-gathers", 2, &C::limit_all_gathers,
       "fsdp: at most 2 units gathered at once (a prefetch past that waits)"},
      {"wrap-policy", 2, &C::wrap_policy, "fsdp: block (each block a unit) or none (one unit)"},
      {"reduce-dtype", 2, &C::reduce_dtype,
       "fsdp: dtype gradients are reduce-scattered in, fp32 or bf16 (half the bytes); "
       "with --precision bf16-mixed units are all-gathered in bf16"},
      {"offload", 2, &C::offload,
       "where state lives between uses, the optimizer step streaming it (fsdp: its parameter "
       "shards, gradients and optimizer state; single, ddp, oss, sdp: the optimizer state): "
       "none, cpu (pinned host memory; CUDA devices only), disk (an unnamed file in "
       "--offload-dir, gone when the run ends)"},
      {"offload-dir", 2, &C::offload_dir,
       "--offload disk: an existing directory for the offload file (default: --output-dir)"},
      {"activation-checkpointing", 2, &C::activation_checkpointing,
       "recompute blocks in backward instead of keeping activations: 0 off, 1 every block, "
       "n every n-th (blocks 0, n, 2n, ...)"},
      {"memory-budget", 2, &C::memory_budget,
       "--strategy auto: bytes per rank the chosen strategy must fit, e.g. 4GiB or 512MiB (default: "
       "available memory / local ranks; CUDA: the GPU's memory)"},
      {"no-memory-check", 2, &C::no_memory_check,
       "skip the pre-flight check that refuses a run whose predicted peak memory exceeds what this "
       "machine has available", true},
      {"cpu-cache", 2, &C::cpu_cache,
       "keep freed CPU blocks of 1 MiB and more for reuse, trimmed every step to what the step "
       "reused (false: back to the system at once, each step's large tensors fresh pages)"},
  };
}

/// Optimisation options (group 3).
std::vector<Field> optimisation_fields() {
  using C = RunConfig;
  return {
      {"max-steps", 3, &C::max_steps, "optimizer steps"},
      {"batch-size", 3, &C::batch_size, "samples per micro-batch per rank"},
      {"accumulate-grad-batches", 3, &C::accumulate_grad_batches, "micro-batches per step"},
      {"optimizer", 3, &C::optimizer,
       "adamw (betas 0.9/0.95) or sgd (plain, no momentum); both decay >= 2-D weights only"},
      {"fused-adamw", 3, &C::fused_adamw,
       "adamw: one fused, vectorised pass per parameter (same math and state as "
       "torch::optim::AdamW, which false selects)"},
      {"lr", 3, &C::lr, "peak learning rate"},
      {"min-lr", 3, &C::min_lr, "final learning rate of the decay"},
      {"warmup-steps", 3, &C::warmup_steps, "linear warm-up steps"},
      {"weight-decay", 3, &C::weight_decay, "weight decay (adamw: decoupled, sgd: L2)"},
      {"gradient-clip-val", 3, &C::gradient_clip_val, "global gradient norm limit (0: off)"},
      {"precision", 3, &C::precision, "32, 32-true, fp32, bf16-mixed or bf16"},
      {"seed", 3, &C::seed, "random seed"},
  };
}

/// Loop and outputs options (group 4).
std::vector<Field> loop_fields() {
  using C = RunConfig;
  return {
      {"log-every-n-steps", 4, &C::log_every_n_steps, "log every N steps"},
      {"val-check-interval", 4, &C::val_check_interval, "validate every N steps (0: at the end)"},
      {"limit-val-batches", 4, &C::limit_val_batches, "validation batches per check (0: none)"},
      {"output-dir", 4, &C::output_dir, "logs, config.ini and checkpoints go here"},
      {"checkpoint-every", 4, &C::checkpoint_every, "checkpoint every N steps (0: never)"},
      {"checkpoint-keep", 4, &C::checkpoint_keep, "newest checkpoints to keep (0: all)"},
      {"checkpoint-format", 4, &C::checkpoint_format,
       "full (rank 0 writes one consolidated file) | sharded (one file per rank) | auto (sharded for "
       "oss/sdp/fsdp, else full); either loads under any strategy and world size"},
      {"checkpoint-monitor", 4, &C::checkpoint_monitor,
       "also keep the best checkpoints by this metric: val_loss, val_accuracy or loss (train loss); "
       "every step it is measured at and would rank among the best is saved (\"\": off)"},
      {"checkpoint-mode", 4, &C::checkpoint_mode, "with --checkpoint-monitor: min or max is better"},
      {"checkpoint-keep-best", 4, &C::checkpoint_keep_best,
       "with --checkpoint-monitor: best checkpoints to keep (never pruned by --checkpoint-keep); "
       "<output-dir>/checkpoints/best names the best"},
      {"early-stopping-patience", 4, &C::early_stopping_patience,
       "validations without improvement before stopping (0: off)"},
      {"resume", 4, &C::resume,
       "checkpoint directory to resume from, or 'last' (the newest in <output-dir>/checkpoints); "
       "continues exactly, appending to <output-dir>/metrics.csv"},
      {"profile", 4, &C::profile,
       "write a Chrome trace of steps 3-5 per rank to DIR/trace-rank<R>.json (Kineto; open in "
       "ui.perfetto.dev or chrome://tracing)"},
      {"peak-flops", 4, &C::peak_flops,
       "one rank's peak FLOP/s, the MFU denominator (0: measured once per machine, threads and dtype, "
       "cached in ~/.cache/strata/peak_flops.json)"},
      {"progress-bar", 4, &C::progress_bar, "live progress bar on a TTY", true},
  };
}

/// Python interop options and testing aids (groups 5, 6).
std::vector<Field> interop_testing_fields() {
  using C = RunConfig;
  return {
      {"init-from", kInteropGroup, &C::init_from,
       "start the GPT from this weights file (nanoGPT parameter names: a torch.save'd state_dict, "
       "a nanoGPT ckpt.pt, or an --export-weights file)"},
      {"export-weights", kInteropGroup, &C::export_weights,
       "after training, write the GPT's weights here under nanoGPT's names (Python: torch.load)"},
      {"torchscript", kInteropGroup, &C::torchscript,
       "train this TorchScript model (torch.jit.script(model).save(...)) instead of the GPT; "
       "model options do not apply (see recipes/torchscript.h for the contract)"},
      {"export-torchscript", kInteropGroup, &C::export_torchscript,
       "with --torchscript: after training, save the trained model here (torch.jit.load)"},
      {"dump-params", kTestingGroup, &C::dump_params,
       "rank 0 saves the final parameters here (torch::save archive; parity tests)"},
      {"debug-extra-param-copy", kTestingGroup, &C::debug_extra_param_copy,
       "every rank keeps an extra fp32 copy of the parameters' size alive for the run (an "
       "injected memory regression: strata-bench's gate test)", true},
  };
}

/// Every RunConfig field, in to_ini() and --help order.
std::vector<Field> fields() {
  std::vector<Field> all;
  for (auto group : {model_data_fields, launch_fields, optimisation_fields, loop_fields, interop_testing_fields}) {
    auto part = group();
    all.insert(all.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  return all;
}

/// The field's value in `config` as command-line / INI text.
std::string text_of(const RunConfig& config, const Field& f) {
  return std::visit([&](auto member) { return format(config.*member); }, f.member);
}

/// Each parse_text returns "" on success, else what was expected.
std::string parse_text(const std::string& s, std::string& out) {
  out = s;
  return "";
}
std::string parse_text(const std::string& s, bool& out) {
  if (s == "true" || s == "1" || s == "yes" || s == "on") {
    out = true;
  } else if (s == "false" || s == "0" || s == "no" || s == "off") {
    out = false;
  } else {
    return "expected true/false, 1/0 or yes/no";
  }
  return "";
}
std::string parse_text(const std::string& s, double& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(out)) {
    return "expected a number";
  }
  return "";
}
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

/// Sets `key` from `text`; returns "" or the one-line error (`where` prefixes it).
std::string apply(RunConfig& config, const std::string& key, const std::string& text,
                  const std::string& where) {
  for (const Field& f : fields()) {
    if (key != f.key) continue;
    const std::string expected =
        std::visit([&](auto member) { return parse_text(text, config.*member); }, f.member);
    if (expected.empty()) return "";
    return where + "invalid value '" + text + "' for " + (where.empty() ? "--" : "") + key + ": " +
           expected;
  }
  return where + "unknown key '" + key + "'";  // not reached: Boost rejects unknown keys first
}

/// The option groups (testing aids last); defaults and choices appear in --help.
std::vector<po::options_description> option_groups(const std::vector<std::string>& presets,
                                                   const std::vector<std::string>& strategies) {
  const RunConfig defaults;  // shown in --help only: values are applied by apply()
  std::vector<po::options_description> groups;
  for (const auto& title : group_titles()) {
    groups.emplace_back(static_cast<int>(groups.size()) == kTestingGroup
                            ? title + " (strata's own tests; listed by --help-all only)"
                            : title + " options");
  }
  for (const Field& f : fields()) {
    auto* value = po::value<std::string>()->value_name(value_name(f.member));
    if (const std::string text = text_of(defaults, f); !text.empty()) value->default_value(text);
    if (f.flag) value->implicit_value("true");
    std::string help = f.help;
    const std::string key = f.key;
    if (key == "preset" && !presets.empty()) help += ": " + join(presets);
    if (key == "strategy" && !strategies.empty()) help += ": " + join(strategies);
    groups[f.group].add_options()(f.key, value, help.c_str());
  }
  return groups;
}

ParseResult failure(std::string message) { return {std::nullopt, 2, std::move(message)}; }

/// Reads --config FILE into `config` and records its keys in `given`; returns
/// "" or the one-line error.
std::string apply_config_file(const std::string& path, const po::options_description& desc,
                              RunConfig& config, GivenKeys& given) {
  const std::string where = "config file '" + path + "': ";
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return "cannot read " + where + "is a directory";
  std::ifstream in(path);
  if (!in) return "cannot read config file '" + path + "': " + std::strerror(errno);
  po::parsed_options parsed(&desc);
  try {
    parsed = po::parse_config_file(in, desc, /*allow_unregistered=*/true);
  } catch (const po::invalid_config_file_syntax& e) {
    return where + "invalid line '" + e.tokens() + "'; expected key = value";
  } catch (const po::error& e) {
    return where + e.what();
  }
  if (in.bad()) return "cannot read config file '" + path + "': " + std::strerror(errno);
  std::map<std::string, int> seen;
  for (const po::option& option : parsed.options) {
    // A key given twice is a mistake whichever value was meant (Boost would
    // keep both and the last would silently win).
    if (++seen[option.string_key] == 2) {
      return where + "key '" + option.string_key + "' is given twice; give it once";
    }
    if (option.unregistered) {
      std::vector<std::string> keys;
      for (const Field& f : fields()) keys.emplace_back(f.key);
      return where + "unknown key '" + option.string_key + "'; valid keys: " + join(keys);
    }
    const std::string error = apply(config, option.string_key, option.value.at(0), where);
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
                       bool all) {
  std::ostringstream usage;
  usage << "Usage: strata-gpt [options]\n\n" << general;  // groups print aligned per group
  for (size_t g = 0; g < groups.size(); ++g) {
    if (all || static_cast<int>(g) != kTestingGroup) usage << '\n' << groups[g];
  }
  if (all) usage << '\n' << kTestingEnvironment << '\n';
  std::string text = usage.str();
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

ParseResult parse(const std::vector<std::string>& argv, const std::vector<std::string>& presets,
                  const std::vector<std::string>& strategies) {
  const auto groups = option_groups(presets, strategies);
  po::options_description general("General options");
  general.add_options()("help,h", "print this help and exit")(
      "help-all", "print every option, testing aids included, and exit")(
      "config", po::value<std::string>()->value_name("FILE"),
      "INI file with the same keys (key = value); the command line wins");
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
      const std::string text = usage_text(general, groups, option.string_key == "help-all");
      return {std::nullopt, 0, text};
    }
    if (option.string_key == "config") config_path = option.value.at(0);
  }

  RunConfig config;
  GivenKeys given;
  if (config_path) {
    const std::string error = apply_config_file(*config_path, file, config, given);
    if (!error.empty()) return failure(error);
  }
  for (const po::option& option : parsed.options) {
    if (option.string_key == "config") continue;
    // A bare flag (--progress-bar) arrives without tokens: its implicit value. Boost
    // takes "--progress-bar false" and "--lr -1" as key and value by itself.
    const std::string text = option.value.empty() ? "true" : option.value.front();
    const std::string error = apply(config, option.string_key, text, "");
    if (!error.empty()) return failure(error);
    given[option.string_key] = "";  // the command line wins: report it there
  }
  if (std::string error = validate(config, presets, strategies, given); !error.empty()) {
    return failure(error);
  }
  return {config, 0, ""};
}

}  // namespace

ParseResult parse_run_config(const std::vector<std::string>& argv,
                             const std::vector<std::string>& preset_names,
                             const std::vector<std::string>& strategy_names) {
  try {
    return parse(argv, preset_names, strategy_names);
  } catch (const std::exception& e) {  // never throw: report whatever slipped through
    return failure(std::string("invalid arguments: ") + e.what());
  }
}

std::string to_ini(const RunConfig& config) {
  const auto titles = group_titles();
  std::ostringstream out;
  int group = -1;
  for (const Field& f : fields()) {
    if (f.group != group) {
      out << (group < 0 ? "" : "\n") << "# " << titles[f.group] << '\n';
      group = f.group;
    }
    const std::string value = text_of(config, f);
    // Commented out where the strategy does not read it: the file then stays
    // valid as --config (a strategy-specific key given to another strategy is
    // an error) and says which knobs this run did not use.
    if (const auto option = unused_by(f.key, config.strategy)) {
      out << "# " << f.key << " = " << value << "  (not used by strategy '" << config.strategy
          << "'; it is for " << option->applies_to << ")\n";
      continue;
    }
    if (std::string(f.key) == "fused-adamw" && config.optimizer != "adamw") {
      out << "# " << f.key << " = " << value << "  (not used by optimizer '" << config.optimizer
          << "'; it is for adamw)\n";
      continue;
    }
    const std::string key = f.key;
    if (const auto why = data_ignores(key, config.data)) {
      out << "# " << f.key << " = " << value << "  (not read: " << *why << ")\n";
      continue;
    }
    if ((key == "checkpoint-mode" || key == "checkpoint-keep-best") && config.checkpoint_monitor.empty()) {
      out << "# " << f.key << " = " << value << "  (not used without checkpoint-monitor)\n";
      continue;
    }
    out << f.key << (value.empty() ? " =" : " = ") << value << '\n';
  }
  return out.str();
}

}  // namespace strata::recipes
