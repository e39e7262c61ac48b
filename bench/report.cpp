#include "bench/report.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace strata::bench {

namespace {

std::string fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, value);
  return buf;
}

std::string short_name(const std::string& case_name) { return case_name.substr(case_name.rfind('/') + 1); }

/// The ZeRO formula for a result, or 0 when it does not apply: the formulas
/// assume fp32 AdamW (bf16-mixed keeps other copies).
double formula_bytes(const BenchCase& c, int64_t parameters, int world_size) {
  if (c.precision != "32") return 0.0;
  for (const char* s : {"single", "ddp", "oss", "sdp", "fsdp"})
    if (c.strategy == s) return zero_model_state_bytes(c.strategy, parameters, world_size);
  return 0.0;
}

std::string ratio_cell(double num, double den, const std::string& ref) {
  return den > 0 ? fixed(num / den, 2) + "× " + short_name(ref) : "–";
}

std::string row(const CaseResult& r, const std::map<std::string, const CaseResult*>& by_name) {
  const BenchCase& c = r.bench_case;
  const auto ref_it = c.reference.empty() ? by_name.end() : by_name.find(c.reference);
  const CaseResult* ref = ref_it == by_name.end() ? nullptr : ref_it->second;
  std::string tps = fixed(r.tokens_per_s.median, 0);
  if (r.runs > 1) tps += " (" + fixed(r.tokens_per_s.min, 0) + "–" + fixed(r.tokens_per_s.max, 0) + ")";
  std::string step_tps = r.median_step_tokens_per_s > 0 ? fixed(r.median_step_tokens_per_s, 0) : "–";
  if (ref && r.median_step_tokens_per_s > 0 && ref->median_step_tokens_per_s > 0)
    step_tps += " (" + fixed(r.median_step_tokens_per_s / ref->median_step_tokens_per_s, 2) + "×)";
  const std::string vs_tps = ref ? ratio_cell(r.tokens_per_s.median, ref->tokens_per_s.median, c.reference) : "–";
  const std::string vs_peak =
      ref ? ratio_cell(double(r.peak_tensor_bytes_max), double(ref->peak_tensor_bytes_max), c.reference) : "–";
  std::string state_vs_formula = "–";
  if (const double f = formula_bytes(c, r.parameters, r.world_size); f > 0) {
    const double diff = double(r.model_state_bytes_max) - f;
    // Tolerance 5%; outside it, show the difference in bytes so it can be
    // compared with the bucket buffers.
    const std::string signed_diff = (diff > 0 ? "+" : "") + format_mib(diff);
    state_vs_formula =
        fixed(double(r.model_state_bytes_max) / f, 3) + (std::abs(diff) <= 0.05 * f ? " ✓" : " (" + signed_diff + ")");
  }
  auto flagged = [](int64_t min, int64_t max) { return format_mib(double(max)) + (min != max ? " *" : ""); };

  std::ostringstream out;
  out << "| " << c.name << " | " << c.strategy << " | " << c.nproc << "×" << c.threads_per_rank << " | "
      << c.precision << " | " << c.batch_size << " | " << tps << " | " << vs_tps << " | " << step_tps << " | "
      << fixed(100.0 * r.mfu, 1) << "% | " << fixed(r.peak_flops_per_rank / 1e9, 1) << " | "
      << flagged(r.peak_tensor_bytes_min, r.peak_tensor_bytes_max) << " | " << vs_peak << " | "
      << (r.peak_rss_bytes_max > 0 ? format_mib(double(r.peak_rss_bytes_max)) : "–") << " | "
      << flagged(r.model_state_bytes_min, r.model_state_bytes_max) << " | " << state_vs_formula << " | "
      << format_mib(r.comm_bytes_per_step) << " | " << fixed(1e3 * r.backward_s_per_step, 1) << " | "
      << fixed(1e3 * r.grad_sync_s_per_step, 1) << " |\n";
  return out.str();
}

}  // namespace

std::string format_mib(double bytes) { return fixed(bytes / (1024.0 * 1024.0), 2) + " MiB"; }

std::string render_markdown(const std::vector<Suite>& suites, const std::vector<CaseResult>& results,
                            const ReportHeader& header) {
  std::map<std::string, const CaseResult*> by_name;
  for (const auto& r : results) by_name[r.bench_case.name] = &r;
  std::ostringstream out;
  out << "**strata-bench** · commit `" << header.commit << "` · " << header.date << " · " << header.machine.uname
      << " · " << header.machine.cpu_model << " (" << header.machine.nproc << " cores, load average "
      << fixed(header.machine.load_average, 2) << " at start) · tokens/s: median of "
      << header.repeats << " interleaved run(s)" << (header.repeats > 1 ? " (min–max)" : "")
      << ", all ranks, first step excluded (summary.json); tokens/s @ median step: tokens per step ÷ the "
         "median step time of steps ≥ 2 (metrics.csv), median over runs, robust to stalls on a shared machine "
         "(ratio to the reference case in parentheses); backward / grad sync wait: rank 0's mean per step, "
         "median over runs — the wait is the gradient communication that backward did not hide\n";
  std::string varies;  // footnote lines
  for (const Suite& suite : suites) {
    out << "\n### " << suite.name << "\n\n" << suite.about << "\n\n"
        << "| case | strategy | ranks×threads | precision | batch/rank | tokens/s | vs ref | tokens/s @ median step "
           "| MFU | peak GFLOP/s/rank | peak tensor/rank | peak vs ref | peak RSS/rank | model state/rank | state/formula "
           "| comm/step (rank 0) | backward ms/step | grad sync wait ms/step |\n"
        << "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const BenchCase& c : suite.cases) {
      auto it = by_name.find(c.name);
      if (it == by_name.end()) continue;
      const CaseResult& r = *it->second;
      if (r.peak_tensor_bytes_min != r.peak_tensor_bytes_max)
        varies += "- " + c.name + ": peak tensor bytes " + std::to_string(r.peak_tensor_bytes_min) + "–" +
                  std::to_string(r.peak_tensor_bytes_max) + "\n";
      if (r.model_state_bytes_min != r.model_state_bytes_max)
        varies += "- " + c.name + ": model-state bytes " + std::to_string(r.model_state_bytes_min) + "–" +
                  std::to_string(r.model_state_bytes_max) + "\n";
      out << row(*it->second, by_name);
    }
  }
  if (!varies.empty()) out << "\n\\* memory differed between repeats (max over ranks; range over runs); the maximum is shown:\n\n" << varies;
  return out.str();
}

nlohmann::json run_record(const CaseRun& run, const ReportHeader& header) {
  const BenchCase& c = *run.bench_case;
  nlohmann::json j = {{"case", c.name},
                      {"suite", c.suite},
                      {"repeat", run.repeat},
                      {"machine", header.machine.to_json()},
                      {"commit", header.commit},
                      {"date", header.date},
                      {"command", run.command},
                      {"wall_s", run.wall_s}};
  for (const auto& item : run.summary.items()) j[item.key()] = item.value();
  j["median_step_tokens_per_s"] = run.median_step_tokens_per_s;
  j["peak_tensor_bytes_max"] = peak_tensor_bytes_max(run.summary);
  j["model_state_bytes_max"] = model_state_bytes_max(run.summary);
  const double f = formula_bytes(c, run.summary.at("parameters").get<int64_t>(), run.summary.at("world_size").get<int>());
  j["model_state_formula_bytes"] = f > 0 ? nlohmann::json(f) : nlohmann::json(nullptr);
  return j;
}

std::vector<CaseRun> read_runs(const std::string& path, const std::vector<BenchCase>& cases, ReportHeader* header) {
  std::ifstream in(path);
  TORCH_CHECK_VALUE(in.good(), "--from-json file '", path, "' cannot be read");
  std::vector<CaseRun> runs;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      auto j = nlohmann::json::parse(line);
      auto it = std::find_if(cases.begin(), cases.end(), [&](const BenchCase& c) { return c.name == j.at("case"); });
      if (it == cases.end()) continue;
      if (runs.empty()) {
        header->machine.uname = j.at("machine").at("uname").get<std::string>();
        header->machine.cpu_model = j.at("machine").at("cpu_model").get<std::string>();
        header->machine.nproc = j.at("machine").at("nproc").get<int>();
        header->machine.load_average = j.at("machine").value("load_average", 0.0);
        header->commit = j.at("commit").get<std::string>();
        header->date = j.at("date").get<std::string>();
      }
      CaseRun run;
      run.bench_case = &*it;
      run.repeat = j.at("repeat").get<int>();
      run.command = j.at("command").get<std::string>();
      run.wall_s = j.at("wall_s").get<double>();
      run.median_step_tokens_per_s = j.value("median_step_tokens_per_s", 0.0);
      header->repeats = std::max(header->repeats, run.repeat + 1);
      run.summary = std::move(j);  // a superset of summary.json's fields
      runs.push_back(std::move(run));
    } catch (const nlohmann::json::exception& e) {
      TORCH_CHECK_VALUE(false, "--from-json file '", path, "' line ", line_no, " is not a strata-bench run record: ",
                        e.what());
    }
  }
  TORCH_CHECK_VALUE(!runs.empty(), "--from-json file '", path, "' holds no run of the selected suites' cases");
  return runs;
}

std::map<std::string, BaselineEntry> read_baseline(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK_VALUE(in.good(), "--baseline file '", path, "' cannot be read (missing?); create one with ",
                    "--write-baseline ", path);
  std::map<std::string, BaselineEntry> out;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      const auto j = nlohmann::json::parse(line);
      BaselineEntry e{j.at("case").get<std::string>(), j.at("tokens_per_s").get<double>(),
                      j.at("peak_tensor_bytes_max").get<int64_t>(), j.at("model_state_bytes_max").get<int64_t>()};
      out[e.case_name] = e;
    } catch (const nlohmann::json::exception& e) {
      TORCH_CHECK_VALUE(false, "--baseline file '", path, "' line ", line_no, " is not a baseline entry ",
                        "{\"case\", \"tokens_per_s\", \"peak_tensor_bytes_max\", \"model_state_bytes_max\"}: ",
                        e.what());
    }
  }
  return out;
}

std::string baseline_text(const std::vector<CaseResult>& results) {
  std::string out;
  for (const auto& r : results) {
    out += nlohmann::json{{"case", r.bench_case.name},
                          {"tokens_per_s", std::round(r.tokens_per_s.median * 10) / 10},
                          {"peak_tensor_bytes_max", r.peak_tensor_bytes_max},
                          {"model_state_bytes_max", r.model_state_bytes_max}}
               .dump() +
           "\n";
  }
  return out;
}

std::string Regression::message() const {
  const bool speed = metric == "tokens_per_s";
  std::ostringstream out;
  out << "regression: " << case_name << " " << metric << " " << fixed(measured, speed ? 1 : 0)
      << (speed ? " < " : " > ") << "limit " << fixed(limit, speed ? 1 : 0) << " (baseline "
      << fixed(baseline, speed ? 1 : 0) << ")";
  return out.str();
}

void validate(const GateOptions& gate) {
  TORCH_CHECK_VALUE(gate.max_slowdown >= 0.0 && gate.max_slowdown < 1.0, "--max-slowdown must be in [0, 1), got ",
                    gate.max_slowdown);
  TORCH_CHECK_VALUE(gate.max_memory_growth >= 0.0, "--max-memory-growth must be >= 0, got ",
                    gate.max_memory_growth);
}

std::vector<Regression> compare_to_baseline(const std::vector<CaseResult>& results,
                                            const std::map<std::string, BaselineEntry>& baseline,
                                            const GateOptions& gate) {
  validate(gate);
  std::vector<Regression> out;
  for (const auto& r : results) {
    auto it = baseline.find(r.bench_case.name);
    if (it == baseline.end()) continue;
    const BaselineEntry& b = it->second;
    const double min_tps = (1.0 - gate.max_slowdown) * b.tokens_per_s;
    if (r.tokens_per_s.median < min_tps)
      out.push_back({b.case_name, "tokens_per_s", r.tokens_per_s.median, b.tokens_per_s, min_tps});
    const double growth = 1.0 + gate.max_memory_growth;
    const std::pair<const char*, std::pair<int64_t, int64_t>> memory[] = {
        {"peak_tensor_bytes_max", {r.peak_tensor_bytes_max, b.peak_tensor_bytes_max}},
        {"model_state_bytes_max", {r.model_state_bytes_max, b.model_state_bytes_max}}};
    for (const auto& [metric, values] : memory) {
      if (double(values.first) > growth * double(values.second))
        out.push_back({b.case_name, metric, double(values.first), double(values.second), growth * values.second});
    }
  }
  return out;
}

}  // namespace strata::bench
