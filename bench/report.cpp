#include "strata/bench/report.h"

#include <c10/util/StringUtil.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

namespace strata::bench {

namespace {

std::string short_name(const std::string& case_name) { return case_name.substr(case_name.rfind('/') + 1); }

/// The model state the strategy's memory model predicted (strata-gpt writes
/// it into summary.json from its StrategySpec::memory), max over ranks; 0
/// when there is none (no model, or everything offloaded).
double formula_bytes(const CaseResult& r) {
  int64_t most = 0;
  for (const RankResult& k : r.ranks) {
    if (k.predicted_params) most = std::max(most, *k.predicted_params + *k.predicted_grads + *k.predicted_optimizer);
  }
  return double(most);
}

double formula_bytes(const nlohmann::json& summary) {
  int64_t most = 0;
  if (!summary.contains("per_rank")) return 0.0;
  for (const auto& pr : summary.at("per_rank")) {
    if (!pr.contains("predicted")) continue;
    const auto& m = pr.at("predicted");
    most = std::max(most, m.value("params", int64_t{0}) + m.value("grads", int64_t{0}) + m.value("optimizer", int64_t{0}));
  }
  return double(most);
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
  if (const double f = formula_bytes(r); f > 0) {
    const double diff = double(r.model_state_bytes_max) - f;
    // Tolerance 5%; outside it, show the difference in bytes so it can be
    // compared with the bucket buffers.
    const std::string signed_diff = c10::str(diff > 0 ? "+" : "", format_mib(diff));
    state_vs_formula =
        fixed(double(r.model_state_bytes_max) / f, 3) + (std::abs(diff) <= 0.05 * f ? " ✓" : " (" + signed_diff + ")");
  }
  auto flagged = [](int64_t min, int64_t max) { return format_mib(double(max)) + (min != max ? " *" : ""); };

  std::ostringstream out;
  out << "| " << c.name << " | " << c.strategy << " | " << c.nproc << "×" << c.threads_per_rank << " | "
      << c.precision << " | " << c.batch_size << " | " << tps << " | " << vs_tps << " | " << step_tps << " | "
      << fixed(100.0 * r.mfu, 1) << "% | " << (r.ceiling_share > 0 ? fixed(100.0 * r.ceiling_share, 1) + "%" : "–")
      << " | " << fixed(r.peak_flops_per_rank / 1e9, 1) << " | "
      << flagged(r.peak_tensor_bytes_min, r.peak_tensor_bytes_max) << " | " << vs_peak << " | "
      << (r.peak_rss_bytes_max > 0 ? format_mib(double(r.peak_rss_bytes_max)) : "–") << " | "
      << flagged(r.model_state_bytes_min, r.model_state_bytes_max) << " | " << state_vs_formula << " | "
      << format_mib(r.comm_bytes_per_step) << " | " << fixed(1e3 * r.backward_s_per_step, 1) << " | "
      << fixed(1e3 * r.grad_sync_s_per_step, 1) << " | " << (r.psi ? format_mib(4.0 * *r.psi) : "—") << " | "
      << (r.comm_ratio_to_psi ? fixed(*r.comm_ratio_to_psi, 2) : "—") << " |\n";
  return out.str();
}

/// For the scale suite: per variant ("ddp-n2"), the last preset (cases are in
/// increasing size) whose case ran, and the first that did not.
std::string largest_that_ran(const Suite& suite, const std::map<std::string, const CaseResult*>& by_name) {
  std::vector<std::string> order;
  std::map<std::string, std::string> largest, first_failure;
  for (const BenchCase& c : suite.cases) {
    const std::string variant = short_name(c.name);
    if (std::find(order.begin(), order.end(), variant) == order.end()) order.push_back(variant);
    auto it = by_name.find(c.name);
    if (it == by_name.end()) continue;
    if (it->second->status == "ok") {
      largest[variant] = c.preset;
    } else if (!first_failure.count(variant)) {
      first_failure[variant] = c.preset + " " + it->second->status + ": " + it->second->error;
    }
  }
  std::ostringstream out;
  out << "\nLargest preset that ran, per strategy and world size:\n\n";
  for (const auto& variant : order) {
    out << "- " << variant << ": " << (largest.count(variant) ? largest[variant] : std::string("none"));
    if (first_failure.count(variant)) out << " (" << first_failure[variant] << ")";
    out << "\n";
  }
  return out.str();
}

}  // namespace

std::string fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, value);
  return buf;
}

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
           "| MFU | share of GEMM ceiling | peak GFLOP/s/rank | peak tensor/rank | peak vs ref | peak RSS/rank | model state/rank | state/model "
           "| comm/step (rank 0) | backward ms/step | grad sync wait ms/step | Ψ (fp32 params) | comm/step ÷ Ψ |\n"
        << "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const BenchCase& c : suite.cases) {
      auto it = by_name.find(c.name);
      if (it == by_name.end()) continue;
      const CaseResult& r = *it->second;
      if (r.runs == 0) {  // failed or skipped before any run finished
        out << "| " << c.name << " | " << c.strategy << " | " << c.nproc << "×" << c.threads_per_rank << " | "
            << c.precision << " | " << c.batch_size << " | **" << r.status << "**: " << r.error
            << " | | | | | | | | | | | | | | |\n";
        continue;
      }
      if (r.status != "ok") varies += "- " + c.name + ": " + r.status + ": " + r.error + "\n";
      if (r.peak_tensor_bytes_min != r.peak_tensor_bytes_max)
        varies += "- " + c.name + ": peak tensor bytes " + std::to_string(r.peak_tensor_bytes_min) + "–" +
                  std::to_string(r.peak_tensor_bytes_max) + "\n";
      if (r.model_state_bytes_min != r.model_state_bytes_max)
        varies += "- " + c.name + ": model-state bytes " + std::to_string(r.model_state_bytes_min) + "–" +
                  std::to_string(r.model_state_bytes_max) + "\n";
      out << row(*it->second, by_name);
    }
    if (suite.name == "scale") out << largest_that_ran(suite, by_name);
  }
  if (!varies.empty())
    out << "\n\\* memory differed between repeats (max over ranks; range over runs; the maximum is shown), or "
           "a repeat failed:\n\n"
        << varies;
  return out.str();
}

nlohmann::json run_record(const CaseRun& run, const ReportHeader& header) {
  const BenchCase& c = *run.bench_case;
  nlohmann::json j = {{"case", c.name},
                      {"suite", c.suite},
                      {"repeat", run.repeat},
                      {"machine", header.machine.to_json()},
                      {"libtorch", header.libtorch},
                      {"commit", header.commit},
                      {"date", header.date},
                      {"command", run.command},
                      {"wall_s", run.wall_s}};
  if (!run.error.empty()) {
    if (run.profiled) j["profiled"] = true;
    j["error"] = run.error;
    j["output_tail"] = run.output_tail;
    return j;
  }
  for (const auto& item : run.summary.items()) j[item.key()] = item.value();
  j["median_step_tokens_per_s"] = run.median_step_tokens_per_s;
  j["best_step_tokens_per_s"] = run.best_step_tokens_per_s;
  if (run.profiled) j["profiled"] = true;
  j["peak_tensor_bytes_max"] = peak_tensor_bytes_max(run.summary);
  j["model_state_bytes_max"] = model_state_bytes_max(run.summary);
  const double f = formula_bytes(run.summary);
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
      run.best_step_tokens_per_s = j.value("best_step_tokens_per_s", 0.0);
      run.error = j.value("error", std::string());
      run.output_tail = j.value("output_tail", std::string());
      run.profiled = j.value("profiled", false);
      header->libtorch = j.value("libtorch", header->libtorch);
      if (!run.profiled) header->repeats = std::max(header->repeats, run.repeat + 1);
      if (run.error.empty()) run.summary = std::move(j);  // a superset of summary.json's fields
      runs.push_back(std::move(run));
    } catch (const nlohmann::json::exception& e) {
      TORCH_CHECK_VALUE(false, "--from-json file '", path, "' line ", line_no, " is not a strata-bench run record: ",
                        e.what());
    }
  }
  TORCH_CHECK_VALUE(!runs.empty(), "--from-json file '", path, "' holds no run of the selected suites' cases");
  return runs;
}

namespace {

std::string dash_or(const std::optional<double>& v, double scale, int digits) {
  return v ? fixed(*v * scale, digits) : "—";
}
std::string dash_or_mib(const std::optional<int64_t>& v) { return v ? format_mib(double(*v)) : "—"; }

std::string comm_cell(const std::map<std::string, double>& by_kind) {
  std::string out;
  for (const auto& [kind, bytes] : by_kind) {
    if (bytes == 0) continue;
    out += (out.empty() ? "" : ", ") + kind + " " + format_mib(bytes);
  }
  return by_kind.empty() ? "—" : out.empty() ? "0" : out;
}

}  // namespace

std::string render_per_rank_markdown(const std::vector<Suite>& suites, const std::vector<CaseResult>& results) {
  std::map<std::string, const CaseResult*> by_name;
  for (const auto& r : results) by_name[r.bench_case.name] = &r;
  std::ostringstream out;
  out << "| case | rank | tokens/s | forward ms | backward ms | comm wait ms | optimizer ms | step ms "
         "| peak tensor | params | grads | optimizer | activations+other | peak RSS "
         "| predicted model state (the strategy's memory model) | measured ÷ predicted | bytes sent/step |\n"
      << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const Suite& suite : suites) {
    for (const BenchCase& c : suite.cases) {
      auto it = by_name.find(c.name);
      if (it == by_name.end()) continue;
      const CaseResult& r = *it->second;
      if (r.runs == 0) {
        out << "| " << c.name << " | | **" << r.status << "**: " << r.error << " | | | | | | | | | | | | | | |\n";
        continue;
      }
      for (const RankResult& k : r.ranks) {
        std::string tps = "—";
        if (k.tokens_per_s) {
          tps = fixed(k.tokens_per_s->median, 0);
          if (r.runs > 1) tps += " (" + fixed(k.tokens_per_s->min, 0) + "–" + fixed(k.tokens_per_s->max, 0) + ")";
        }
        std::string predicted = "—", ratio = "—";
        if (k.predicted_params && k.predicted_grads && k.predicted_optimizer) {
          const int64_t p = *k.predicted_params + *k.predicted_grads + *k.predicted_optimizer;
          predicted = format_mib(double(p));
          if (k.params && k.grads && k.optimizer && p > 0)
            ratio = fixed(double(*k.params + *k.grads + *k.optimizer) / double(p), 3);
        }
        out << "| " << c.name << " | " << k.rank << " | " << tps << " | " << dash_or(k.forward_s, 1e3, 1) << " | "
            << dash_or(k.backward_s, 1e3, 1) << " | " << dash_or(k.comm_wait_s, 1e3, 1) << " | "
            << dash_or(k.optimizer_s, 1e3, 1) << " | " << dash_or(k.step_s, 1e3, 1) << " | "
            << dash_or_mib(k.peak_tensor_bytes) << " | " << dash_or_mib(k.params) << " | " << dash_or_mib(k.grads)
            << " | " << dash_or_mib(k.optimizer) << " | " << dash_or_mib(k.activations_other) << " | "
            << dash_or_mib(k.peak_rss_bytes) << " | " << predicted << " | " << ratio << " | "
            << comm_cell(k.comm_bytes_per_step) << " |\n";
      }
    }
  }
  return out.str();
}

std::string render_phase_markdown(const std::vector<Suite>& suites, const std::vector<CaseResult>& results) {
  std::map<std::string, const CaseResult*> by_name;
  for (const auto& r : results)
    if (r.phases || !r.phase_error.empty()) by_name[r.bench_case.name] = &r;
  if (by_name.empty()) return "";
  int64_t steps = 0;
  for (const auto& [name, r] : by_name)
    if (r->phases) steps = r->phases->steps;
  std::ostringstream out;
  out << "\n### where a step goes\n\nRank 0's main thread over " << steps
      << " traced steps of one more, untimed run of each case (--profile; the profiler slows what it records, so "
         "compare shares, not milliseconds, with the tables above): ms per step (share). An op that is attention, "
         "the optimizer step or a communication or offload wait counts whole; any other op's own time counts as "
         "GEMM (mm, addmm, bmm, linear, matmul), allocation (empty*, resize_) or element-wise & other; outside "
         "ops is the time in no op (hooks, the autograd engine, Python, and user scopes' own time such as FSDP2's "
         "Python-side waits, which PyTorch does not record as waits). Rules: bench/phase_split.h.\n\n"
      << "| case | traced step ms";
  for (const auto& name : phase_names()) out << " | " << name;
  out << " |\n|---|---:";
  for (size_t i = 0; i < phase_names().size(); ++i) out << "|---:";
  out << "|\n";
  for (const Suite& suite : suites) {
    for (const BenchCase& c : suite.cases) {
      auto it = by_name.find(c.name);
      if (it == by_name.end()) continue;
      const CaseResult& r = *it->second;
      if (!r.phases) {
        out << "| " << c.name << " | **no split**: " << r.phase_error << std::string(phase_names().size() + 1, '|')
            << "\n";
        continue;
      }
      out << "| " << c.name << " | " << fixed(r.phases->step_ms, 1);
      for (const auto& name : phase_names()) {
        const double ms = r.phases->ms_per_step.at(name);
        out << " | " << fixed(ms, 1) << " (" << fixed(100.0 * ms / std::max(r.phases->step_ms, 1e-9), 0) << "%)";
      }
      out << " |\n";
    }
  }
  return out.str();
}

nlohmann::json case_record(const CaseResult& r, const ReportHeader& header) {
  const BenchCase& c = r.bench_case;
  auto opt = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  nlohmann::json j = {{"case", c.name},
                      {"suite", c.suite},
                      {"status", r.status},
                      {"error", r.error},
                      {"preset", c.preset},
                      {"strategy", c.strategy},
                      {"nproc", c.nproc},
                      {"threads_per_rank", c.threads_per_rank},
                      {"precision", c.precision},
                      {"device", c.device},
                      {"batch_size", c.batch_size},
                      {"block_size", c.block_size},
                      {"steps", c.steps},
                      {"model_flags", c.model_flags},
                      {"extra", c.extra},
                      {"reference", c.reference},
                      {"machine", header.machine.to_json()},
                      {"cores", header.machine.nproc},
                      {"libtorch", header.libtorch},
                      {"commit", header.commit},
                      {"date", header.date},
                      {"runs", r.runs}};
  if (r.runs == 0) return j;
  j["tokens_per_s"] = {{"median", r.tokens_per_s.median}, {"min", r.tokens_per_s.min}, {"max", r.tokens_per_s.max}};
  j["median_step_tokens_per_s"] = r.median_step_tokens_per_s;
  j["best_step_tokens_per_s"] = r.best_step_tokens_per_s;
  j["mfu"] = r.mfu;
  j["ceiling_share"] = r.ceiling_share;
  j["parameters"] = r.parameters;
  j["world_size"] = r.world_size;
  j["peak_tensor_bytes_max"] = r.peak_tensor_bytes_max;
  j["model_state_bytes_max"] = r.model_state_bytes_max;
  j["peak_rss_bytes_max"] = r.peak_rss_bytes_max;
  j["comm_bytes_per_step"] = r.comm_bytes_per_step_by_kind;
  j["psi"] = opt(r.psi);
  j["comm_ratio_to_psi"] = opt(r.comm_ratio_to_psi);
  j["matmul_peak_flops"] = opt(r.matmul_peak_flops);
  if (r.phases) j["phase_split"] = r.phases->to_json();
  if (!r.phase_error.empty()) j["phase_split_error"] = r.phase_error;
  j["per_rank"] = nlohmann::json::array();
  for (const RankResult& k : r.ranks) {
    nlohmann::json pr = {{"rank", k.rank},
                         {"forward_s", opt(k.forward_s)},
                         {"backward_s", opt(k.backward_s)},
                         {"comm_wait_s", opt(k.comm_wait_s)},
                         {"optimizer_s", opt(k.optimizer_s)},
                         {"step_s", opt(k.step_s)},
                         {"peak_tensor_bytes", opt(k.peak_tensor_bytes)},
                         {"peak_rss_bytes", opt(k.peak_rss_bytes)},
                         {"memory",
                          {{"params", opt(k.params)},
                           {"grads", opt(k.grads)},
                           {"optimizer", opt(k.optimizer)},
                           {"activations_other", opt(k.activations_other)}}},
                         {"predicted",
                          {{"params", opt(k.predicted_params)},
                           {"grads", opt(k.predicted_grads)},
                           {"optimizer", opt(k.predicted_optimizer)}}},
                         {"comm_bytes_per_step", k.comm_bytes_per_step}};
    pr["tokens_per_s"] = k.tokens_per_s ? nlohmann::json{{"median", k.tokens_per_s->median},
                                                         {"min", k.tokens_per_s->min},
                                                         {"max", k.tokens_per_s->max}}
                                        : nlohmann::json(nullptr);
    j["per_rank"].push_back(pr);
  }
  return j;
}

}  // namespace strata::bench
