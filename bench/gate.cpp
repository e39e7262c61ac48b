#include "strata/bench/gate.h"

#include "strata/bench/report.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace strata::bench {

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
      BaselineEntry e;
      e.case_name = j.at("case").get<std::string>();
      e.device = j.at("device").get<std::string>();
      e.reference = j.value("reference", std::string());
      e.tokens_per_s = j.at("tokens_per_s").get<double>();
      if (j.contains("tokens_per_s_vs_ref") && !j.at("tokens_per_s_vs_ref").is_null())
        e.tokens_per_s_vs_ref = j.at("tokens_per_s_vs_ref").get<double>();
      e.peak_tensor_bytes_max = j.at("peak_tensor_bytes_max").get<int64_t>();
      e.model_state_bytes_max = j.at("model_state_bytes_max").get<int64_t>();
      e.comm_bytes_per_step = j.at("comm_bytes_per_step").get<std::map<std::string, double>>();
      TORCH_CHECK_VALUE(out.emplace(e.case_name, e).second, "--baseline file '", path, "' line ", line_no,
                        " repeats case '", e.case_name, "'");
    } catch (const nlohmann::json::exception& e) {
      TORCH_CHECK_VALUE(false, "--baseline file '", path, "' line ", line_no, " is not a baseline entry ",
                        "{\"case\", \"device\", \"tokens_per_s\", \"peak_tensor_bytes_max\", "
                        "\"model_state_bytes_max\", \"comm_bytes_per_step\"} (regenerate it with --write-baseline): ",
                        e.what());
    }
  }
  return out;
}

namespace {

const CaseResult* find_result(const std::vector<CaseResult>& results, const std::string& name) {
  for (const auto& r : results)
    if (r.bench_case.name == name) return &r;
  return nullptr;
}

/// comparable tokens/s ÷ the reference's, when both ran.
std::optional<double> ratio_to_reference(const CaseResult& r, const std::vector<CaseResult>& results) {
  if (r.bench_case.reference.empty() || r.runs == 0) return std::nullopt;
  const CaseResult* ref = find_result(results, r.bench_case.reference);
  if (ref == nullptr || ref->runs == 0 || comparable_tokens_per_s(*ref) <= 0) return std::nullopt;
  return comparable_tokens_per_s(r) / comparable_tokens_per_s(*ref);
}

}  // namespace

BaselineEntry baseline_entry(const CaseResult& r, const std::vector<CaseResult>& results) {
  BaselineEntry e;
  e.case_name = r.bench_case.name;
  e.device = r.bench_case.device;
  e.reference = r.bench_case.reference;
  e.tokens_per_s = std::round(r.tokens_per_s.median * 10) / 10;
  if (auto ratio = ratio_to_reference(r, results)) e.tokens_per_s_vs_ref = std::round(*ratio * 1e4) / 1e4;
  e.peak_tensor_bytes_max = r.peak_tensor_bytes_max;
  e.model_state_bytes_max = r.model_state_bytes_max;
  e.comm_bytes_per_step = r.comm_bytes_per_step_by_kind;
  return e;
}

std::string baseline_text(const std::vector<CaseResult>& results) {
  std::string out;
  for (const auto& r : results) {
    if (r.status != "ok") continue;
    const BaselineEntry e = baseline_entry(r, results);
    out += nlohmann::json{{"case", e.case_name},
                          {"device", e.device},
                          {"reference", e.reference},
                          {"tokens_per_s", e.tokens_per_s},
                          {"tokens_per_s_vs_ref", e.tokens_per_s_vs_ref ? nlohmann::json(*e.tokens_per_s_vs_ref)
                                                                        : nlohmann::json(nullptr)},
                          {"peak_tensor_bytes_max", e.peak_tensor_bytes_max},
                          {"model_state_bytes_max", e.model_state_bytes_max},
                          {"comm_bytes_per_step", e.comm_bytes_per_step}}
               .dump() +
           "\n";
  }
  return out;
}

std::string Regression::message() const {
  return "regression: " + case_name + " " + metric + " " + measured + " (baseline " + baseline + "; " + limit + ")";
}

void validate(const GateOptions& gate) {
  TORCH_CHECK_VALUE(gate.max_ratio_drop >= 0.0 && gate.max_ratio_drop < 1.0,
                    "--max-ratio-drop must be in [0, 1), got ", gate.max_ratio_drop);
  TORCH_CHECK_VALUE(gate.max_memory_growth >= 0.0, "--max-memory-growth must be >= 0, got ",
                    gate.max_memory_growth);
}

std::vector<Regression> compare_to_baseline(const std::vector<CaseResult>& results,
                                            const std::map<std::string, BaselineEntry>& baseline,
                                            const GateOptions& gate) {
  validate(gate);
  std::vector<Regression> out;
  if (baseline.empty()) {
    out.push_back({"(all cases)", "baseline", "—", "—", "the baseline holds no case: nothing would be checked"});
  }
  const std::string pct_mem = fixed(100 * gate.max_memory_growth, 0) + "%";
  for (const auto& r : results) {
    const std::string& name = r.bench_case.name;
    if (r.status == "skipped") continue;
    auto it = baseline.find(name);
    if (it == baseline.end()) {
      out.push_back({name, "missing from baseline", "—", r.status,
                     "every case needs a baseline entry (renamed or new? regenerate with --write-baseline)"});
      continue;
    }
    const BaselineEntry& b = it->second;
    if (r.status != "ok") {
      out.push_back({name, "failed", "ok", r.status, r.error});
      continue;
    }
    if (b.device != r.bench_case.device) {
      out.push_back({name, "device", b.device, r.bench_case.device, "a baseline is for one device only"});
      continue;
    }
    const double growth = 1.0 + gate.max_memory_growth;
    // The smallest over repeats: an added buffer raises every run, while at
    // gpt-nano's size the peak of a strategy that frees gradients as their
    // reduces finish (sdp, oss) moves by up to ~8% with the timing of a run.
    const std::pair<const char*, std::pair<int64_t, int64_t>> memory[] = {
        {"peak tensor bytes", {r.peak_tensor_bytes_min, b.peak_tensor_bytes_max}},
        {"model-state bytes", {r.model_state_bytes_min, b.model_state_bytes_max}}};
    for (const auto& [metric, values] : memory) {
      if (double(values.first) > growth * double(values.second)) {
        out.push_back({name, metric, std::to_string(values.second), std::to_string(values.first),
                       "limit " + fixed(growth * double(values.second), 0) + " (+" + pct_mem + "), +" +
                           fixed(100.0 * (double(values.first) / double(std::max<int64_t>(values.second, 1)) - 1), 1) +
                           "%"});
      }
    }
    // Bytes sent are a function of the model and the strategy only: any change
    // is a change in what the strategy communicates.
    std::set<std::string> kinds;
    for (const auto& kv : b.comm_bytes_per_step) kinds.insert(kv.first);
    for (const auto& kv : r.comm_bytes_per_step_by_kind) kinds.insert(kv.first);
    for (const auto& kind : kinds) {
      auto bi = b.comm_bytes_per_step.find(kind);
      auto ri = r.comm_bytes_per_step_by_kind.find(kind);
      const double bv = bi == b.comm_bytes_per_step.end() ? 0.0 : bi->second;
      const double rv = ri == r.comm_bytes_per_step_by_kind.end() ? 0.0 : ri->second;
      if (std::abs(rv - bv) > 1e-6 * std::max(1.0, std::abs(bv)))
        out.push_back({name, "bytes sent per step (" + kind + ")", fixed(bv, 0), fixed(rv, 0), "must not change"});
    }
    if (b.tokens_per_s_vs_ref) {
      const auto ratio = ratio_to_reference(r, results);
      const double limit = (1.0 - gate.max_ratio_drop) * *b.tokens_per_s_vs_ref;
      if (!ratio) {
        out.push_back({name, "tokens/s ÷ ref", fixed(*b.tokens_per_s_vs_ref, 3), "—",
                       "reference " + r.bench_case.reference + " did not run"});
      } else if (*ratio < limit) {
        out.push_back({name, "tokens/s ÷ ref", fixed(*b.tokens_per_s_vs_ref, 3), fixed(*ratio, 3),
                       "limit " + fixed(limit, 3) + " (-" + fixed(100 * gate.max_ratio_drop, 0) + "%)"});
      }
    }
  }
  for (const auto& [name, entry] : baseline) {
    if (find_result(results, name) == nullptr)
      out.push_back({name, "missing from results", "present", "—",
                     "every baseline case must run (renamed, or a suite not selected?)"});
  }
  return out;
}

std::string render_regressions(const std::vector<Regression>& regressions) {
  std::ostringstream out;
  out << "| case | metric | baseline | measured | limit / why |\n|---|---|---:|---:|---|\n";
  for (const auto& r : regressions)
    out << "| " << r.case_name << " | " << r.metric << " | " << r.baseline << " | " << r.measured << " | " << r.limit
        << " |\n";
  return out.str();
}
}  // namespace strata::bench
