#pragma once
// The sweep harness behind strata-bench: built-in suites of cases, each case one
// run of the real strata-gpt binary as a subprocess (its --output-dir in a work
// directory), and the aggregation of its summary.json over repeats.
//
// Repeats are interleaved (A B C A B C ...) so that a noisy, shared machine
// slows every variant alike; throughput is reported as median and min–max,
// memory (exact, from the tracking allocator) as a value.
//
// Example:
//   strata::StrategyRegistry strategies;
//   strata::register_builtin_strategies(strategies);
//   strata::recipes::ModelRegistry models;
//   strata::recipes::register_builtin_models(models);
//   strata::bench::SuiteRegistry registry;
//   strata::bench::register_builtin_suites(registry, strategies, models);
//   auto suites = registry.select("smoke");
//   strata::bench::RunOptions opts("build/bin/strata-gpt", "/tmp/work");
//   for (const auto& run : strata::bench::run_interleaved(all_cases(suites), opts)) ...
#include "strata/bench/phase_split.h"
#include "strata/recipes/models/spec.h"
#include "strata/strategies/registry.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata::bench {

/// `data` value meaning "the harness's generated text file" (see write_generated_text).
inline constexpr const char* kGeneratedText = "generated-text";

/// One strata-gpt configuration; run `repeats` times.
struct BenchCase {
  std::string name;              ///< unique key, "<suite>/<preset>/<variant>"; baselines use it
  std::string suite;
  std::string preset;  ///< a registered model preset
  std::string strategy = "single";
  int nproc = 1;
  int threads_per_rank = 1;
  std::string precision = "32";
  int64_t steps = 20;
  int64_t batch_size = 8;        ///< per rank
  int64_t block_size = 0;        ///< 0: the data's natural length
  std::string data = kGeneratedText;
  std::string device = "cpu";    ///< pinned (--device), so a CUDA build never meets CPU baselines
  /// The model's own flags (its family's options, such as a width), part of
  /// its shape: before `extra` on the command line.
  std::vector<std::string> model_flags;
  std::vector<std::string> extra;  ///< further strata-gpt flags
  std::string reference;         ///< name of the case the "vs ref" columns divide by ("": none)
  /// What runs: "strata-gpt", or "peer" (bench/peers/gpt_peer.py, the PyTorch
  /// 2.x program for the same job, in `peer_mode`: the strategy's
  /// StrategySpec::pytorch_peer; `extra` holds the peer's own flags).
  std::string program = "strata-gpt";
  std::string peer_mode;
  /// Start from the same weights as every other shared_init case of this model:
  /// a file gpt_peer.py --write-init draws once per model shape (preset,
  /// block size and `model_flags`), passed as --init-from.
  bool shared_init = false;
  /// Their format: "pt" (a torch.save file, beside --preset) or "hf" (a
  /// transformers directory, which names the model: strata-gpt gets no --preset).
  std::string shared_init_format = "pt";
  std::string skip_reason;       ///< non-empty: not run (an invalid sweep combination), reported as skipped
  /// After the timed repeats, run once more with --profile (a few steps, not
  /// timed: the profiler slows what it records); rank 0's trace gives
  /// CaseResult::phases (bench/phase_split.h).
  bool phase_split = false;
};

/// A named group of cases and what its comparisons mean.
struct Suite {
  std::string name;
  std::string about;  ///< one paragraph for the report
  std::vector<BenchCase> cases;
};

/// Suite name -> a function building it, as StrategyRegistry does for
/// strategies. Filled explicitly (no self-registering statics): the built-in
/// suites by register_builtin_suites(), other suites by their own
/// registry.add() calls from strata-bench's main.
class SuiteRegistry {
 public:
  using Factory = std::function<Suite()>;
  /// Adds `name` (listed in this order); a duplicate or empty name is an error.
  void add(const std::string& name, Factory factory);
  /// Names, in registration order.
  std::vector<std::string> names() const;
  /// The suites named in `csv` ("zero,memory"), in the order given. Throws
  /// c10::ValueError naming the bad value and the allowed ones for an
  /// unknown, empty or repeated name.
  std::vector<Suite> select(const std::string& csv) const;

 private:
  std::vector<std::pair<std::string, Factory>> entries_;
};

/// The built-in suites, built from the registered strategies' specs
/// (strategies/spec.h) and model families' bench workloads
/// (recipes/models/bench_workloads.h), which `strategies` and `models` must
/// outlive `registry` to build. The strategy suites run
/// ModelRegistry::bench_family()'s workloads:
///  - one suite per strategy, named after it: its plain case and its
///    StrategySpec::bench variants on the small and medium workload, the plain case
///    against the reference strategy's (the reference against the
///    single-process strategy at the same global batch), variants against
///    their own plain case;
///  - zero (every multi-rank strategy against the reference), memory (those
///    whose state shrinks with N, at N = 1, 2, 4), smoke (the CI gate: every
///    strategy and the variants that join "smoke"), attention, kernels, scale,
///    planner and peer (every family that gives their workloads; peer: the
///    strategies with a PyTorch counterpart).
void register_builtin_suites(SuiteRegistry& registry, const StrategyRegistry& strategies,
                             const recipes::ModelRegistry& models);

/// Names of the built-in suites over the built-in strategies and families, in report order.
std::vector<std::string> suite_names();

/// The built-in suites over the built-in strategies and families named in `csv`
/// (SuiteRegistry::select over them).
std::vector<Suite> select_suites(const std::string& csv);

/// The cases of `suites`, concatenated.
std::vector<BenchCase> all_cases(const std::vector<Suite>& suites);

/// strata-gpt's argv for one case (argv[0] = `gpt_binary`).
std::vector<std::string> gpt_command(const BenchCase& c, const std::string& gpt_binary,
                                     const std::string& data_path, const std::string& output_dir);

/// The peer's argv for a "peer" case: `python peer_script --mode ...`, with
/// the case's model, data, batch and steps (the peer writes strata-gpt's
/// summary.json / metrics.csv layout into `output_dir`).
std::vector<std::string> peer_command(const BenchCase& c, const std::string& python, const std::string& peer_script,
                                      const std::string& data_path, const std::string& output_dir);

/// The model-shape flags of `c` for --write-init: --preset, --block-size and
/// any --n-layer/--n-head/--n-embd/--bias in its extra flags.
std::vector<std::string> model_shape_flags(const BenchCase& c);

/// Writes `bytes` deterministic pseudo-random printable ASCII bytes (same file
/// on every machine) to `path`: realistic-width matmuls at any --block-size.
void write_generated_text(const std::string& path, int64_t bytes = int64_t(2) << 20);


/// Median (mean of the middle two for an even count), min and max.
struct Stats {
  double median = 0.0, min = 0.0, max = 0.0;
};
Stats compute_stats(std::vector<double> values);

/// Host description for reports and JSON lines.
struct MachineInfo {
  std::string uname;      ///< "Linux 6.1.0 x86_64"
  std::string cpu_model;  ///< /proc/cpuinfo "model name", "unknown" if absent
  int nproc = 0;
  double load_average = 0.0;  ///< 1-minute, when the bench started (a noisy machine shows here)
  nlohmann::json to_json() const;
};
MachineInfo machine_info();

/// `git rev-parse --short HEAD` in `source_dir`, "-dirty" appended when tracked
/// files differ from HEAD; "unknown" without git or a repository.
std::string git_commit(const std::string& source_dir);

/// Current UTC time, ISO 8601.
std::string utc_now();

/// `body`'s exit code, or a one-line error on stderr and strata-bench's exit
/// code for it: 2 for bad input (c10::ValueError), 1 for anything else thrown
/// (e.g. an unparsable summary.json).
int exit_code_of(const std::function<int()>& body);

/// LibTorch's version ("1.13.1"), compiled in.
std::string libtorch_version();

/// One finished run of one case.
struct CaseRun {
  const BenchCase* bench_case = nullptr;
  int repeat = 0;                ///< 0-based
  std::string command;           ///< shell-quoted strata-gpt command line
  double wall_s = 0.0;           ///< whole subprocess, start-up included
  std::string error;             ///< non-empty: the run failed (crash, OOM, timeout); summary is null
  std::string output_tail;       ///< a failed run's last lines of output
  /// The untimed --profile run of a phase_split case: its summary carries
  /// "phase_split" (PhaseSplit::to_json) or "phase_split_error"; it counts in
  /// no timing or memory figure.
  bool profiled = false;
  nlohmann::json summary;        ///< summary.json as written by strata-gpt
  /// Tokens per step (all ranks) ÷ the median step time of steps 2.. from
  /// metrics.csv: robust to a few stalled steps on a shared machine. 0 if unknown.
  double median_step_tokens_per_s = 0.0;
  /// Tokens per step ÷ the fastest step of steps 2..: on a machine shared with
  /// other work, the step least slowed by it. 0 if unknown.
  double best_step_tokens_per_s = 0.0;
};

/// How to run cases.
struct RunOptions {
  RunOptions(std::string gpt_binary, std::string work_dir)
      : gpt_binary(std::move(gpt_binary)), work_dir(std::move(work_dir)) {}
  std::string gpt_binary;
  std::string work_dir;        ///< holds the generated data, logs and output dirs
  int repeats = 1;
  double case_timeout_s = 600;  ///< SIGTERM (then SIGKILL) a run that takes longer
  /// Case name that also gets strata-gpt's hidden --debug-extra-param-copy
  /// (the gate test's injected memory regression); "" none.
  std::string inject_regression;
  /// For "peer" cases and shared initial weights: the Python with torch and the peer script.
  std::string python;
  std::string peer_script;
  /// Called after each run (progress, JSON lines); may be empty.
  std::function<void(const CaseRun&)> on_run;
};

/// Runs every case that is not skipped `options.repeats` times, interleaved.
/// A run that exits non-zero, times out or writes no summary is returned with
/// its error (a case that failed once is not run again) and the sweep goes on.
std::vector<CaseRun> run_interleaved(const std::vector<BenchCase>& cases, const RunOptions& options);

/// One rank's numbers for a case (medians over runs for times, max over runs
/// for memory); absent (nullopt, shown "—") when the summaries lack them.
struct RankResult {
  int rank = 0;
  std::optional<Stats> tokens_per_s;
  std::optional<double> forward_s, backward_s, comm_wait_s, optimizer_s, step_s;  ///< per step
  std::optional<int64_t> peak_tensor_bytes, peak_rss_bytes;
  /// At the peak: params, grads, optimizer, activations_other.
  std::optional<int64_t> params, grads, optimizer, activations_other;
  /// The strategy's memory model's prediction (summary.json "predicted",
  /// written by strata-gpt from its StrategySpec::memory); params, grads, optimizer.
  std::optional<int64_t> predicted_params, predicted_grads, predicted_optimizer;
  std::map<std::string, double> comm_bytes_per_step;  ///< by collective kind (empty: unknown)
};

/// What a case's runs add up to.
struct CaseResult {
  BenchCase bench_case;
  std::string status = "ok";  ///< "ok", "failed" or "skipped"
  std::string error;          ///< why failed / skipped
  int runs = 0;
  Stats tokens_per_s;                 ///< summary.json's (all steps but the first)
  double median_step_tokens_per_s = 0.0;  ///< median over runs of CaseRun's (0 if unknown)
  double best_step_tokens_per_s = 0.0;    ///< max over runs of CaseRun's (0 if unknown)
  double mfu = 0.0;                 ///< median over runs
  /// tokens/s over the GEMM-bound ceiling (summary.json's ceiling_share,
  /// recipes/app/gemm_ceiling.h), median over runs; 0: none (CUDA, TorchScript).
  double ceiling_share = 0.0;
  double peak_flops_per_rank = 0.0; ///< median over runs
  int64_t parameters = 0;
  int world_size = 1;
  int64_t peak_tensor_bytes_max = 0;  ///< max over ranks, then max over runs
  int64_t model_state_bytes_max = 0;  ///< params+grads+optimizer, max over ranks, then max over runs
  int64_t peak_tensor_bytes_min = 0;  ///< max over ranks, then min over runs (== max unless runs disagree)
  int64_t model_state_bytes_min = 0;
  int64_t peak_rss_bytes_max = 0;     ///< max over ranks and runs (0: not reported)
  double comm_bytes_per_step = 0.0;   ///< rank 0, all collectives, first run
  /// Rank 0's backward and gradient-sync wait per step (summary.json), median
  /// over runs; 0 when the summaries lack them.
  double backward_s_per_step = 0.0;
  double grad_sync_s_per_step = 0.0;
  /// Rank 0's bytes sent per step by collective kind (first run).
  std::map<std::string, double> comm_bytes_per_step_by_kind;
  std::vector<RankResult> ranks;  ///< one per rank
  /// Top-level figures when summary.json has them (median over runs): psi is
  /// the parameter count (Ψ in bytes is 4 x psi for fp32).
  std::optional<double> psi, comm_ratio_to_psi, matmul_peak_flops;
  /// Training loss after the last step (median over runs).
  std::optional<double> final_train_loss;
  /// Bytes through the loopback interface per step during the run, as the
  /// harness counts them (/proc/net/dev, transmit; median over runs): every
  /// program's collectives and store traffic alike, strata's or PyTorch's.
  std::optional<double> loopback_bytes_per_step;
  /// Where rank 0's step goes by phase, from the profiled run (BenchCase::phase_split);
  /// phase_error says why a profiled run gave none (a case whose timed runs
  /// failed has no profiled run, and neither).
  std::optional<PhaseSplit> phases;
  std::string phase_error;
};

/// tokens/s for ratios between cases of one run (the gate's): the best-step
/// figure when known (the least disturbed by other work on a shared machine:
/// ratios of medians moved by 2-4x between back-to-back runs here), else the
/// median-step figure, else summary.json's median.
double comparable_tokens_per_s(const CaseResult& r);

/// Max over ranks of a summary's per-rank arrays.
int64_t peak_tensor_bytes_max(const nlohmann::json& summary);
int64_t model_state_bytes_max(const nlohmann::json& summary);
/// Max over ranks of peak_rss_bytes (0 when the summary lacks it).
int64_t peak_rss_bytes_max(const nlohmann::json& summary);

/// Aggregates the runs of `c` (summaries in repeat order; at least one), with
/// their median-step throughputs when known.
CaseResult aggregate(const BenchCase& c, const std::vector<nlohmann::json>& summaries,
                     const std::vector<double>& median_step_tokens_per_s = {},
                     const std::vector<double>& best_step_tokens_per_s = {});

/// Median step time (s) of steps >= 2 in a strata-gpt metrics.csv; 0 if unreadable.
double median_step_seconds(const std::string& metrics_csv);
/// The fastest step time (s) of steps >= 2; 0 if unreadable.
double min_step_seconds(const std::string& metrics_csv);

/// aggregate() for every case, from run_interleaved()'s output; a skipped case
/// or one with a failed run gives a CaseResult with that status and error
/// (its metrics from the successful runs, if any).
std::vector<CaseResult> aggregate_runs(const std::vector<BenchCase>& cases, const std::vector<CaseRun>& runs);

/// `items` with `sep` between them ("a, b, c").
std::string join(const std::vector<std::string>& items, const std::string& sep);

}  // namespace strata::bench
