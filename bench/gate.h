#pragma once
// strata-bench's fairscale-style regression gate against a baseline file.
//
// Baseline file: JSON lines, one per case,
//   {"case": "smoke/gpt-nano/oss-2x1", "device": "cpu", "reference": "smoke/gpt-nano/ddp-2x1",
//    "tokens_per_s": 81234.5, "tokens_per_s_vs_ref": 0.93, "peak_tensor_bytes_max": 1234567,
//    "model_state_bytes_max": 345678, "comm_bytes_per_step": {"all_reduce": 0, ...}}
// The gate (compare_to_baseline) fails a case whose peak tensor or model-state
// bytes (the smallest over repeats, against the baseline's largest) grow more
// than max_memory_growth, whose bytes
// sent per step (rank 0, per collective kind) change at all, or whose tokens/s
// ÷ its reference case's in the same run (comparable_tokens_per_s: the best
// step of the best repeat) drops more than max_ratio_drop below
// the baseline's ratio (ratios, because absolute times on a shared machine are
// noisy). A case missing from the baseline, a baseline case missing from the
// results, an empty baseline, a device mismatch and a failed case fail too.
#include "strata/bench/harness.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace strata::bench {

/// One baseline line.
struct BaselineEntry {
  std::string case_name;
  std::string device = "cpu";
  std::string reference;                ///< "" when the case has none
  double tokens_per_s = 0.0;            ///< informational (not gated)
  std::optional<double> tokens_per_s_vs_ref;  ///< comparable tokens/s ÷ the reference's
  int64_t peak_tensor_bytes_max = 0;
  int64_t model_state_bytes_max = 0;
  std::map<std::string, double> comm_bytes_per_step;  ///< rank 0, by collective kind
};

/// Reads a baseline file; throws c10::ValueError naming the path (and line)
/// when it is missing or malformed.
std::map<std::string, BaselineEntry> read_baseline(const std::string& path);

/// The baseline entry of `result` (whose reference, if any, is among `results`).
BaselineEntry baseline_entry(const CaseResult& result, const std::vector<CaseResult>& results);

/// Baseline lines for the successful `results`.
std::string baseline_text(const std::vector<CaseResult>& results);

struct GateOptions {
  double max_ratio_drop = 0.15;     ///< fail below (1 - this) × the baseline's tokens/s ÷ ref
  double max_memory_growth = 0.02;  ///< fail above (1 + this) × baseline bytes
};

/// Throws c10::ValueError naming the value unless max_ratio_drop is in [0, 1)
/// and max_memory_growth >= 0.
void validate(const GateOptions& gate);

/// One failed check.
struct Regression {
  std::string case_name;
  /// "peak tensor bytes", "model-state bytes", "bytes sent per step (KIND)",
  /// "tokens/s ÷ ref", "missing from baseline", "missing from results",
  /// "device", "failed", "baseline".
  std::string metric;
  std::string baseline;  ///< the baseline's value, as text ("—" none)
  std::string measured;  ///< ditto for this run
  std::string limit;     ///< the bound that was crossed, or why it fails
  /// "regression: smoke/gpt-nano/ddp-2x1 peak tensor bytes 106 > limit 104 (baseline 102)"
  std::string message() const;
};

/// Checks `results` against `baseline` (see the file comment); validates
/// `gate` first.
std::vector<Regression> compare_to_baseline(const std::vector<CaseResult>& results,
                                            const std::map<std::string, BaselineEntry>& baseline,
                                            const GateOptions& gate);

/// A Markdown table of what moved: case | metric | baseline | measured | limit.
std::string render_regressions(const std::vector<Regression>& regressions);

}  // namespace strata::bench
