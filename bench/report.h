#pragma once
// Reports for strata-bench: Markdown tables (one per suite) and one JSON line
// per run. The regression gate against a baseline file is bench/gate.h.
#include "strata/bench/harness.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace strata::bench {

/// Where and when the numbers were taken.
struct ReportHeader {
  MachineInfo machine;
  std::string commit = "unknown";
  std::string date;
  std::string libtorch = "unknown";
  int repeats = 1;
};

/// "12.3 MiB".
std::string format_mib(double bytes);
/// `value` with `digits` decimals ("%.*f").
std::string fixed(double value, int digits);

/// Markdown: a header line, then per suite its description and one table row
/// per case (tokens/s median (min–max), vs-ref ratios, MFU, peak tensor and
/// model-state bytes per rank, measured ÷ the strategy's memory model, comm per step).
std::string render_markdown(const std::vector<Suite>& suites, const std::vector<CaseResult>& results,
                            const ReportHeader& header);

/// Markdown: one row per rank of every case of `suites` (tokens/s, step-time
/// split, peak tensor bytes by category, peak RSS, the memory model's prediction beside the
/// measured model state with the ratio, bytes sent per step by collective
/// kind); "—" for what the summaries lack. Failed and skipped cases get one
/// row with their error.
std::string render_per_rank_markdown(const std::vector<Suite>& suites, const std::vector<CaseResult>& results);

/// Markdown: where each phase_split case's step goes (CaseResult::phases),
/// a row per case, ms per step and share by phase; "" when no case has one.
std::string render_phase_markdown(const std::vector<Suite>& suites, const std::vector<CaseResult>& results);

/// One results.jsonl line per case: case, suite, status, error, the case's
/// configuration, machine, cores, threads per rank, LibTorch version, commit,
/// date, the aggregated figures and the per-rank array.
nlohmann::json case_record(const CaseResult& result, const ReportHeader& header);

/// One JSON line: case, suite, repeat, machine, commit, date, command, wall_s,
/// every summary.json field, and the derived peak_tensor_bytes_max,
/// model_state_bytes_max and model_state_formula_bytes (the strategy's memory
/// model's, from summary.json; null when it has none or nothing stays in memory).
nlohmann::json run_record(const CaseRun& run, const ReportHeader& header);

/// The runs of `cases` recorded in a --json file (lines of other cases are
/// skipped); `header` gets the first matching line's machine, commit and date
/// and the number of repeats. Throws c10::ValueError naming the path when it
/// is unreadable, malformed or holds no run of `cases`. The returned runs point
/// into `cases`.
std::vector<CaseRun> read_runs(const std::string& path, const std::vector<BenchCase>& cases, ReportHeader* header);

}  // namespace strata::bench
