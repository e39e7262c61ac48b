#pragma once
// StrategySpec: everything strata knows about a strategy, in one place.
//
// A strategy describes itself once — its name and aliases, its own typed
// options (with parsing, validation and help), what one rank holds and sends
// per step, how the memory planner and the benchmark harness should try it,
// and how to build it — and registers that description with a
// StrategyRegistry (registry.h). Everything else reads the registered specs
// and keeps no list of strategy names or formulas of its own: strata-gpt's
// command line, --help and config.ini, the DeepSpeed / Accelerate config
// translators, the planner and --strategy auto, and strata-bench's suites,
// tables and charts. The built-in strategies register exactly this way (each
// from its own folder: strategies/ddp/spec.cpp, ...), and so does a user's
// (examples/local_sgd).
//
// Example (a user's strategy with one option of its own):
//   strata::StrategySpec spec("local-sgd", "each rank steps alone; parameters averaged every K steps");
//   spec.options({strata::StrategyOption::integer("sync-every", 8, "steps between averages").at_least(1)})
//       .factory([](strata::Comm comm, const strata::StrategyArgs& args, const strata::StrategyContext&) {
//         return std::make_unique<LocalSGD>(comm, args.integer("sync-every"));
//       })
//       .memory(strata::replicated_memory);
//   registry.add(spec);
#include "strata/core/precision.h"
#include "strata/strategies/comm.h"
#include "strata/strategies/strategy.h"

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace strata {

/// A strategy option's value: bool, integer, real or text (a choice is text).
using OptionValue = std::variant<bool, int64_t, double, std::string>;

enum class OptionKind { kBool, kInt, kReal, kText };

/// "BOOL", "INT", "FLOAT", "STR": how --help names a kind.
const char* option_kind_name(OptionKind kind);

/// `value` as command-line / INI text ("true", "25", "0.5", "full_shard").
std::string option_text(const OptionValue& value);

/// Command-line / INI text as a bool (true/false, 1/0, yes/no, on/off) or a
/// finite number: "" on success, else what was expected. strata-gpt's own
/// options read their text the same way.
std::string parse_bool_text(const std::string& text, bool& out);
std::string parse_real_text(const std::string& text, double& out);

/// One option of a strategy: --key on strata-gpt's command line, `key = value`
/// in an INI config, a line in --help and config.ini. Several strategies may
/// declare the same key (ddp, oss and sdp each read --bucket-cap-mb): they
/// must agree on its kind and default; each checks its own range.
class StrategyOption {
 public:
  /// true/false (also 1/0, yes/no, on/off). `bare`: `--key` alone means true.
  static StrategyOption boolean(std::string key, bool default_value, std::string help, bool bare = false);
  static StrategyOption integer(std::string key, int64_t default_value, std::string help);
  static StrategyOption real(std::string key, double default_value, std::string help);
  /// One of `choices` (the default among them).
  static StrategyOption choice(std::string key, std::string default_value, std::vector<std::string> choices,
                               std::string help);
  static StrategyOption text(std::string key, std::string default_value, std::string help);

  /// Numbers: the value must be >= `min` (at_least) or > `min` (above).
  StrategyOption& at_least(double min);
  StrategyOption& above(double min);
  /// Numbers: the value must be < `max` (a probability, a fraction).
  StrategyOption& below(double max);

  const std::string& key() const { return key_; }
  OptionKind kind() const { return kind_; }
  const OptionValue& default_value() const { return default_; }
  const std::vector<std::string>& choices() const { return choices_; }
  const std::string& help() const { return help_; }
  bool bare() const { return bare_; }
  /// The value's rule for messages: "> 0", ">= 1", "in [0, 1)", "one of a, b" ("" when any value of the kind goes).
  std::string rule() const;

  /// Parses `text` as this option's kind: "" on success, else what was
  /// expected ("expected a number"). Kind only: see check() for the rule.
  std::string parse(const std::string& text, OptionValue& out) const;
  /// "" when `value` follows the option's rule (range, choices), else the rule it breaks.
  std::string check(const OptionValue& value) const;

 private:
  StrategyOption(std::string key, OptionKind kind, OptionValue default_value, std::string help);

  std::string key_;
  OptionKind kind_;
  OptionValue default_;
  std::vector<std::string> choices_;
  std::string help_;
  bool bare_ = false;
  std::optional<double> min_;
  bool min_exclusive_ = false;
  std::optional<double> max_;  ///< exclusive
};

/// A strategy's options as one run resolved them: every option its spec
/// declares, given or defaulted, typed. Built by StrategySpec::parse_args.
class StrategyArgs {
 public:
  StrategyArgs() = default;

  /// The value of `key` as the option's kind; an error naming the key when the
  /// spec does not declare it or it has another kind.
  bool boolean(const std::string& key) const;
  int64_t integer(const std::string& key) const;
  double real(const std::string& key) const;
  const std::string& text(const std::string& key) const;
  /// Whether the run gave `key` (command line or config), rather than its default.
  bool given(const std::string& key) const { return given_.count(key) != 0; }
  bool has(const std::string& key) const { return values_.count(key) != 0; }

  void set(const std::string& key, OptionValue value, bool given);
  const std::map<std::string, OptionValue>& values() const { return values_; }

 private:
  const OptionValue& at(const std::string& key) const;

  std::map<std::string, OptionValue> values_;
  std::set<std::string> given_;
};

/// What a strategy's factory and checks may read besides its own options:
/// the run's settings that belong to no one strategy.
struct StrategyContext {
  /// Ranks in the world; 0: the Comm's size (StrategyRegistry::create fills it in).
  int world_size = 0;
  /// Ranks per node (LOCAL_WORLD_SIZE); 0: unknown (fsdp's hybrid_shard then refuses to start).
  int local_world_size = 0;
  torch::Device device = torch::kCPU;
  Precision precision = Precision::kFp32;
  /// Where state lives between uses: "none", "cpu" (pinned host memory,
  /// CUDA only) or "disk"; what moves there is the strategy's choice.
  std::string offload = "none";
  std::string offload_dir;  ///< disk: an existing directory
};

/// The model as memory and communication models see it: parameter counts,
/// split into the wrap units of the unit seam (core/training_module.h).
struct ModelSize {
  int64_t params = 0;          ///< Ψ': every parameter
  int64_t trainable = 0;       ///< t: those with a gradient (frozen: params - trainable)
  int64_t units = 0;           ///< wrap units (0: the model calls none)
  int64_t unit_params = 0;     ///< parameters of one unit (the units have one shape)
  int64_t unit_trainable = 0;  ///< trainable ones of one unit
  /// Parameters in no unit (embeddings, the head's norm): the root.
  int64_t root_params() const { return params - units * unit_params; }
  int64_t root_trainable() const { return trainable - units * unit_trainable; }
};

/// What one rank's memory (or communication) is asked for.
/// ceil(a / b) for a >= 0, b > 0: what one of b ranks holds of a elements
/// split evenly with padding (flat buffers are padded to a multiple of b).
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct MemoryQuery {
  ModelSize model;
  int world_size = 1;
  int local_world_size = 1;
  /// Optimizer state per trainable parameter: 8 (AdamW's two fp32 moments),
  /// 4 (SGD with momentum), 0 (plain SGD).
  int64_t optimizer_bytes_per_param = 8;
  /// Bytes of one element in compute: 4 (fp32), 2 (bf16-mixed, 16-mixed).
  int64_t compute_bytes = 4;
  std::string offload = "none";
  /// Micro-batches per optimizer step (gradient accumulation).
  int64_t micro_batches = 1;
  /// `model` is one pipeline stage whose micro-batches a schedule runs
  /// (Strategy::begin_scheduled_step): what the strategy holds through that
  /// step goes in `gathered`; a strategy that does not model it says
  /// predicts_peak false.
  bool scheduled_step = false;
  StrategyArgs args;  ///< the strategy's options (defaults when not given)
};

/// Bytes one rank holds under a strategy (parameters are fp32: 4 bytes each).
struct MemoryEstimate {
  int64_t params = 0;      ///< model state between steps: parameters,
  int64_t grads = 0;       ///< gradients,
  int64_t optimizer = 0;   ///< and optimizer state
  /// Transient full copies during a step beyond the model state (fsdp's
  /// gathered units and their full gradients).
  int64_t gathered = 0;
  /// Buffers alive outside the activation phase (oss/sdp's flat staging);
  /// the peak holds the larger of these and the activations.
  int64_t staging = 0;
  /// Other bytes the strategy holds for the whole run beyond the model state
  /// (a user's local SGD: its last synchronised parameters and outer momentum).
  int64_t held = 0;
  /// Bytes this rank keeps in its offload tier (disk space, pinned memory).
  int64_t offloaded = 0;
  /// Activations relative to one unsharded replica (1; tensor parallelism < 1).
  double activation_scale = 1.0;
  /// Gradients exist only from backward to the step (set to none after it),
  /// so the activation peak at the start of backward meets none of them.
  bool grads_freed_between_steps = false;
  /// False: only the model state and offloaded bytes are modelled, not what
  /// a step adds (the planner and the pre-flight check leave it out).
  bool predicts_peak = true;
  int64_t model_state() const { return params + grads + optimizer; }
};

/// Bytes one rank sends per optimizer step, by collective (CommBytes'
/// conventions: ring all-reduce 2(N-1)/N·S, all-gather and reduce-scatter
/// (N-1)/N·S). Setup's one-time broadcast is not per step.
struct CommEstimate {
  std::map<CollectiveKind, double> bytes;
  double total() const;
};

/// One configuration the planner (and --strategy auto) tries: this strategy
/// with some options, activation checkpointing or offload.
struct PlanVariant {
  std::string label = "";   ///< "fsdp+ac"
  /// The documented speed order: candidates are tried fastest first, lower
  /// ranks first. Built-ins: single 0, single+ac 5; ddp 10, oss 20, sdp 30,
  /// fsdp 40, sdp+offload-disk 45, fsdp+ac 50, fsdp+tpT and single+tpT 55,
  /// fsdp+ac+tpT and single+ac+tpT 58, fsdp+offload-disk 60.
  double speed_rank = 100;
  int min_world_size = 1;    ///< offered only from this many (data-parallel) ranks
  int64_t activation_checkpointing = 0;  ///< 0: what the run asks
  std::string offload = "none";
  /// Offered beside tensor parallelism instead (the spec must compose with
  /// it: StrategySpec::tensor_parallel): once per size T > 1 that divides
  /// the ranks per machine and that the model splits over, as "<label>+tpT"
  /// over world / T data-parallel ranks, with sequence parallelism where the
  /// sequence splits too; smaller T first.
  bool tensor_parallel = false;
  /// True: it trains what single trains (only how state is split differs), so
  /// --strategy auto may pick it. False: listed, never picked.
  bool exact = true;
};

/// A case the benchmark harness adds for this strategy beyond its plain one:
/// "<name>-<tag>-<N>x<threads>" in its own suite ("<name>") and in `suites`.
struct BenchVariant {
  // (Every member has an initializer: specs list variants with designated
  // initializers, naming only what differs.)
  std::string tag = "";                   ///< "ac", "offload-disk"
  std::vector<std::string> flags = {};    ///< strata-gpt flags it adds
  std::string precision = "32";
  /// Other built-in suites it joins: "smoke" (the CI gate), "scale", "planner".
  std::vector<std::string> suites = {};
  /// The tag of this strategy's variant its vs-ref column divides by in the
  /// strategy's own suite ("": its plain case).
  std::string reference = "";
  std::string about = "";                 ///< one line for the suite's description
};

/// See the file comment. Built in the torch::optim options style:
///   StrategySpec(name, description).aliases({...}).options({...}).factory(...)...
struct StrategySpec {
  using Factory =
      std::function<std::unique_ptr<Strategy>(Comm comm, const StrategyArgs& args, const StrategyContext& context)>;
  /// "" or the one-line error of options that contradict each other.
  using Validate = std::function<std::string(const StrategyArgs& args)>;
  /// "" or the one-line error of options the run cannot have (the world, the device, offload).
  using Check = std::function<std::string(const StrategyArgs& args, const StrategyContext& context)>;
  /// nullopt: no formula for these options (the planner then stays out).
  using MemoryModel = std::function<std::optional<MemoryEstimate>(const MemoryQuery& query)>;
  using CommModel = std::function<std::optional<CommEstimate>(const MemoryQuery& query)>;

  StrategySpec(std::string name, std::string description)
      : name_(std::move(name)), description_(std::move(description)) {}

  /// The registry name, --strategy's value, checkpoints' and reports' label.
  TORCH_ARG(std::string, name);
  TORCH_ARG(std::string, description);
  TORCH_ARG(std::vector<std::string>, aliases) = {};
  TORCH_ARG(std::vector<StrategyOption>, options) = {};
  TORCH_ARG(Factory, factory) = nullptr;
  TORCH_ARG(Validate, validate) = nullptr;
  TORCH_ARG(Check, check) = nullptr;
  /// The most ranks it runs on (0: any): single says 1.
  TORCH_ARG(int, max_world_size) = 0;
  /// Runs over data-parallel groups beside tensor parallelism (strata-gpt's
  /// --tp-size, strategies/tp): it accepts a ModelParallel
  /// (Strategy::set_model_parallel) and keeps the base's per-parameter
  /// gradient norms. world_size and max_world_size then count one group.
  TORCH_ARG(bool, tensor_parallel) = false;
  /// The baseline other strategies are compared with (ddp): bench's vs-ref
  /// columns and charts, sweeps' reference case. One registered spec at most.
  TORCH_ARG(bool, reference) = false;
  TORCH_ARG(MemoryModel, memory) = nullptr;
  TORCH_ARG(CommModel, communication) = nullptr;
  TORCH_ARG(std::vector<PlanVariant>, plan) = {};
  TORCH_ARG(std::vector<BenchVariant>, bench) = {};
  /// The mode of bench/peers/gpt_peer.py that runs the same job in PyTorch
  /// ("": none; the peer suite leaves the strategy out).
  TORCH_ARG(std::string, pytorch_peer) = "";
  /// The DeepSpeed zero_optimization.stage it stands for (-1: none).
  TORCH_ARG(int, deepspeed_zero_stage) = -1;
  /// Accelerate's distributed_type values it stands for (NO, MULTI_CPU, FSDP, ...).
  TORCH_ARG(std::vector<std::string>, accelerate_types) = {};

 public:  // (TORCH_ARG leaves the section private)
  /// The option `key`, or null when this spec does not declare it.
  const StrategyOption* find_option(const std::string& key) const;
  /// Every declared option, from `given` (key -> text as given) or its
  /// default; throws c10::ValueError, one line naming the key, the value and
  /// what is allowed, for an undeclared key, a bad value or a validate() error.
  StrategyArgs parse_args(const std::map<std::string, std::string>& given = {}) const;
  /// "" or the check() error (none declared: "").
  std::string check_run(const StrategyArgs& args, const StrategyContext& context) const;
};

// ---- Memory and communication models the built-ins share --------------------

/// Everything replicated (single, ddp): 4Ψ' params + 4t grads + k·t state.
std::optional<MemoryEstimate> replicated_memory(const MemoryQuery& query);

/// Applies `context.offload` the way single, ddp, oss and sdp do: the
/// optimizer state moves to the tier (strategies/offloaded_moments.h),
/// parameters and gradients stay. Returns `strategy`.
std::unique_ptr<Strategy> offload_optimizer_state_as_asked(std::unique_ptr<Strategy> strategy,
                                                           const StrategyContext& context);

/// The same offload's memory: the optimizer state leaves memory for the tier.
MemoryEstimate with_optimizer_offload(MemoryEstimate estimate, const MemoryQuery& query);

/// "" or the error for --offload `context.offload` on this device (cpu needs
/// CUDA, disk a directory): what offload_optimizer_state_as_asked checks; a
/// StrategySpec::check for the strategies that offload that way.
std::string optimizer_offload_problem(const StrategyArgs& args, const StrategyContext& context);

}  // namespace strata
