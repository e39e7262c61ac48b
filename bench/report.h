#pragma once
// Reports for strata-bench: Markdown tables (one per suite), one JSON line per
// run, and the fairscale-style regression gate against a baseline file.
//
// Baseline file: JSON lines, one per case,
//   {"case": "smoke/gpt-nano/ddp-2x1", "tokens_per_s": 81234.5,
//    "peak_tensor_bytes_max": 1234567, "model_state_bytes_max": 345678}
// A case regresses when its median tokens/s < (1 - max_slowdown) × baseline
// (generous: CI machines are noisy) or either memory value > (1 +
// max_memory_growth) × baseline (memory is exact, so the bound is tight).
#include "bench/harness.h"

#include <map>
#include <string>
#include <vector>

namespace strata::bench {

/// Where and when the numbers were taken.
struct ReportHeader {
  MachineInfo machine;
  std::string commit = "unknown";
  std::string date;
  int repeats = 1;
};

/// "12.3 MiB".
std::string format_mib(double bytes);

/// Markdown: a header line, then per suite its description and one table row
/// per case (tokens/s median (min–max), vs-ref ratios, MFU, peak tensor and
/// model-state bytes per rank, measured/ZeRO-formula, comm per step).
std::string render_markdown(const std::vector<Suite>& suites, const std::vector<CaseResult>& results,
                            const ReportHeader& header);

/// One JSON line: case, suite, repeat, machine, commit, date, command, wall_s,
/// every summary.json field, and the derived peak_tensor_bytes_max,
/// model_state_bytes_max and model_state_formula_bytes (null when not fp32 or no formula).
nlohmann::json run_record(const CaseRun& run, const ReportHeader& header);

/// The runs of `cases` recorded in a --json file (lines of other cases are
/// skipped); `header` gets the first matching line's machine, commit and date
/// and the number of repeats. Throws c10::ValueError naming the path when it
/// is unreadable, malformed or holds no run of `cases`. The returned runs point
/// into `cases`.
std::vector<CaseRun> read_runs(const std::string& path, const std::vector<BenchCase>& cases, ReportHeader* header);

/// One baseline line.
struct BaselineEntry {
  std::string case_name;
  double tokens_per_s = 0.0;
  int64_t peak_tensor_bytes_max = 0;
  int64_t model_state_bytes_max = 0;
};

/// Reads a baseline file; throws c10::Error naming the path (and line) when it
/// is missing or malformed.
std::map<std::string, BaselineEntry> read_baseline(const std::string& path);

/// Baseline lines for `results` (median tokens/s, exact memory).
std::string baseline_text(const std::vector<CaseResult>& results);

struct GateOptions {
  double max_slowdown = 0.5;        ///< fail below (1 - this) × baseline tokens/s
  double max_memory_growth = 0.05;  ///< fail above (1 + this) × baseline bytes
};

/// Throws c10::Error naming the value unless max_slowdown is in [0, 1) and
/// max_memory_growth >= 0.
void validate(const GateOptions& gate);

/// One failed check.
struct Regression {
  std::string case_name;
  std::string metric;  ///< "tokens_per_s", "peak_tensor_bytes_max", "model_state_bytes_max"
  double measured = 0.0;
  double baseline = 0.0;
  double limit = 0.0;  ///< the bound that was crossed
  /// "regression: smoke/gpt-nano/ddp-2x1 tokens_per_s 1000 < limit 2000 (baseline 4000, max slowdown 50%)"
  std::string message() const;
};

/// Checks every result that has a baseline entry (others are not gated);
/// validates `gate` first.
std::vector<Regression> compare_to_baseline(const std::vector<CaseResult>& results,
                                            const std::map<std::string, BaselineEntry>& baseline,
                                            const GateOptions& gate);

}  // namespace strata::bench
