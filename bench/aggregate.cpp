// A case's numbers: its runs' summary.json files aggregated per rank and
// over repeats (medians for times, maxima for memory), and the strategy's
// memory model's prediction they are compared with (from summary.json).
#include "strata/bench/harness.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>

namespace strata::bench {

namespace {

int64_t max_over_ranks(const nlohmann::json& per_rank, const std::function<int64_t(const nlohmann::json&)>& value) {
  int64_t best = 0;
  for (const auto& item : per_rank) best = std::max(best, value(item));
  return best;
}

std::optional<double> median_of(const std::vector<double>& values) {
  if (values.empty()) return std::nullopt;
  return compute_stats(values).median;
}

std::optional<int64_t> max_of(const std::vector<int64_t>& values) {
  if (values.empty()) return std::nullopt;
  return *std::max_element(values.begin(), values.end());
}

/// One rank's numbers, one entry per run that reported them.
struct RankSamples {
  std::vector<double> tps, forward, backward, comm_wait, optimizer, step;
  std::vector<int64_t> peak, rss, params, grads, opt, other, pparams, pgrads, popt;
  std::map<std::string, double> comm;
};

void put_d(std::vector<double>& v, const nlohmann::json& j, const char* key) {
  if (j.contains(key) && j.at(key).is_number()) v.push_back(j.at(key).get<double>());
}
void put_i(std::vector<int64_t>& v, const nlohmann::json& j, const char* key) {
  if (j.contains(key) && j.at(key).is_number()) v.push_back(j.at(key).get<int64_t>());
}

/// One entry of summary.json's "per_rank" array.
void add_rank_entry(const nlohmann::json& pr, RankSamples& x) {
  put_d(x.tps, pr, "tokens_per_s");
  put_d(x.forward, pr, "forward_s");
  put_d(x.backward, pr, "backward_s");
  put_d(x.comm_wait, pr, "comm_wait_s");
  put_d(x.optimizer, pr, "optimizer_s");
  put_d(x.step, pr, "step_s");
  put_i(x.peak, pr, "peak_tensor_bytes");
  put_i(x.rss, pr, "peak_rss_bytes");
  if (pr.contains("memory")) {
    const auto& m = pr.at("memory");
    put_i(x.params, m, "params");
    put_i(x.grads, m, "grads");
    put_i(x.opt, m, "optimizer");
    put_i(x.other, m, "activations_other");
  }
  if (pr.contains("predicted")) {
    const auto& m = pr.at("predicted");
    put_i(x.pparams, m, "params");
    put_i(x.pgrads, m, "grads");
    put_i(x.popt, m, "optimizer");
  }
  if (x.comm.empty() && pr.contains("comm_bytes_per_step"))
    for (const auto& item : pr.at("comm_bytes_per_step").items())
      if (item.value().is_number()) x.comm[item.key()] = item.value().get<double>();
}

/// Older summaries: per-rank memory arrays, rank 0's times and bytes.
void add_legacy_summary(const nlohmann::json& s, std::vector<RankSamples>& samples) {
  for (size_t r = 0; r < samples.size(); ++r) {
    RankSamples& x = samples[r];
    if (s.contains("peak_tensor_bytes") && r < s.at("peak_tensor_bytes").size())
      x.peak.push_back(s.at("peak_tensor_bytes")[r].get<int64_t>());
    if (s.contains("peak_rss_bytes") && r < s.at("peak_rss_bytes").size())
      x.rss.push_back(s.at("peak_rss_bytes")[r].get<int64_t>());
    if (s.contains("model_state_bytes") && r < s.at("model_state_bytes").size()) {
      const auto& m = s.at("model_state_bytes")[r];
      put_i(x.params, m, "params");
      put_i(x.grads, m, "grads");
      put_i(x.opt, m, "optimizer");
      put_i(x.other, m, "other");
    }
  }
  RankSamples& zero = samples[0];
  put_d(zero.backward, s, "backward_s_per_step");
  put_d(zero.comm_wait, s, "grad_sync_s_per_step");
  const int64_t steps = s.value("steps", int64_t{0});
  if (zero.comm.empty() && steps > 0 && s.contains("comm_bytes_rank0"))
    for (const auto& item : s.at("comm_bytes_rank0").items())
      zero.comm[item.key()] = item.value().get<double>() / double(steps);
}

/// Medians of the times, maxima of the bytes.
RankResult rank_result(int rank, const RankSamples& x) {
  RankResult rr;
  rr.rank = rank;
  if (!x.tps.empty()) rr.tokens_per_s = compute_stats(x.tps);
  rr.forward_s = median_of(x.forward);
  rr.backward_s = median_of(x.backward);
  rr.comm_wait_s = median_of(x.comm_wait);
  rr.optimizer_s = median_of(x.optimizer);
  rr.step_s = median_of(x.step);
  rr.peak_tensor_bytes = max_of(x.peak);
  rr.peak_rss_bytes = max_of(x.rss);
  rr.params = max_of(x.params);
  rr.grads = max_of(x.grads);
  rr.optimizer = max_of(x.opt);
  rr.activations_other = max_of(x.other);
  rr.predicted_params = max_of(x.pparams);
  rr.predicted_grads = max_of(x.pgrads);
  rr.predicted_optimizer = max_of(x.popt);
  rr.comm_bytes_per_step = x.comm;
  return rr;
}

/// Per-rank numbers over runs: summary.json's "per_rank" array when present,
/// else what the older per-rank arrays (peak_tensor_bytes, model_state_bytes,
/// peak_rss_bytes) and rank 0's scalars give.
std::vector<RankResult> aggregate_ranks(const std::vector<nlohmann::json>& summaries, int world_size) {
  std::vector<RankSamples> samples(static_cast<size_t>(std::max(world_size, 1)));
  for (const auto& s : summaries) {
    if (!s.contains("per_rank") || !s.at("per_rank").is_array()) {
      add_legacy_summary(s, samples);
      continue;
    }
    for (const auto& pr : s.at("per_rank")) {
      const size_t r = pr.value("rank", 0);
      if (r >= samples.size()) samples.resize(r + 1);
      add_rank_entry(pr, samples[r]);
    }
  }
  std::vector<RankResult> out;
  for (size_t r = 0; r < samples.size(); ++r) out.push_back(rank_result(static_cast<int>(r), samples[r]));
  return out;
}

}  // namespace

Stats compute_stats(std::vector<double> values) {
  TORCH_CHECK_VALUE(!values.empty(), "compute_stats: no values");
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return {n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2, values.front(), values.back()};
}

int64_t peak_tensor_bytes_max(const nlohmann::json& summary) {
  // 0 when absent: a program without strata's tensor tracker (the peer suite's PyTorch).
  if (!summary.contains("peak_tensor_bytes")) return 0;
  return max_over_ranks(summary.at("peak_tensor_bytes"), [](const nlohmann::json& v) { return v.get<int64_t>(); });
}

int64_t peak_rss_bytes_max(const nlohmann::json& summary) {
  if (!summary.contains("peak_rss_bytes")) return 0;
  return max_over_ranks(summary.at("peak_rss_bytes"), [](const nlohmann::json& v) { return v.get<int64_t>(); });
}

int64_t model_state_bytes_max(const nlohmann::json& summary) {
  if (!summary.contains("model_state_bytes")) return 0;
  return max_over_ranks(summary.at("model_state_bytes"), [](const nlohmann::json& m) {
    return m.at("params").get<int64_t>() + m.at("grads").get<int64_t>() + m.at("optimizer").get<int64_t>();
  });
}

double comparable_tokens_per_s(const CaseResult& r) {
  if (r.best_step_tokens_per_s > 0) return r.best_step_tokens_per_s;
  return r.median_step_tokens_per_s > 0 ? r.median_step_tokens_per_s : r.tokens_per_s.median;
}

CaseResult aggregate(const BenchCase& c, const std::vector<nlohmann::json>& summaries,
                     const std::vector<double>& median_step_tokens_per_s,
                     const std::vector<double>& best_step_tokens_per_s) {
  TORCH_CHECK_VALUE(!summaries.empty(), "aggregate: no runs for case ", c.name);
  CaseResult r;
  r.bench_case = c;
  r.runs = static_cast<int>(summaries.size());
  std::vector<double> tps, mfu, ceiling, peak_flops, backward, grad_sync;
  for (const auto& s : summaries) {
    tps.push_back(s.at("tokens_per_s").get<double>());
    backward.push_back(s.value("backward_s_per_step", 0.0));
    grad_sync.push_back(s.value("grad_sync_s_per_step", 0.0));
    // null: unknown (an MFU above 1 against its peak is not reported).
    mfu.push_back(s.contains("mfu") && s.at("mfu").is_number() ? s.at("mfu").get<double>() : 0.0);
    ceiling.push_back(s.contains("ceiling_share") && s.at("ceiling_share").is_number()
                          ? s.at("ceiling_share").get<double>()
                          : 0.0);
    peak_flops.push_back(s.value("peak_flops_per_rank", 0.0));
    const int64_t peak = peak_tensor_bytes_max(s), state = model_state_bytes_max(s);
    const bool first = &s == &summaries.front();
    r.peak_tensor_bytes_max = first ? peak : std::max(r.peak_tensor_bytes_max, peak);
    r.peak_tensor_bytes_min = first ? peak : std::min(r.peak_tensor_bytes_min, peak);
    r.model_state_bytes_max = first ? state : std::max(r.model_state_bytes_max, state);
    r.model_state_bytes_min = first ? state : std::min(r.model_state_bytes_min, state);
    r.peak_rss_bytes_max = std::max(r.peak_rss_bytes_max, peak_rss_bytes_max(s));
  }
  r.tokens_per_s = compute_stats(tps);
  if (!median_step_tokens_per_s.empty()) r.median_step_tokens_per_s = compute_stats(median_step_tokens_per_s).median;
  if (!best_step_tokens_per_s.empty()) r.best_step_tokens_per_s = compute_stats(best_step_tokens_per_s).max;
  r.mfu = compute_stats(mfu).median;
  r.ceiling_share = compute_stats(ceiling).median;
  r.peak_flops_per_rank = compute_stats(peak_flops).median;
  r.backward_s_per_step = compute_stats(backward).median;
  r.grad_sync_s_per_step = compute_stats(grad_sync).median;
  const auto& first = summaries.front();
  r.parameters = first.at("parameters").get<int64_t>();
  r.world_size = first.at("world_size").get<int>();
  int64_t comm = 0;
  for (const auto& item : first.at("comm_bytes_rank0").items()) comm += item.value().get<int64_t>();
  const int64_t steps = first.at("steps").get<int64_t>();
  r.comm_bytes_per_step = steps > 0 ? double(comm) / double(steps) : 0.0;
  for (const auto& item : first.at("comm_bytes_rank0").items())
    r.comm_bytes_per_step_by_kind[item.key()] = steps > 0 ? item.value().get<double>() / double(steps) : 0.0;
  r.ranks = aggregate_ranks(summaries, r.world_size);
  std::vector<double> psi, ratio, peak, loss, loopback;
  for (const auto& s : summaries) {
    if (s.contains("final_train_loss") && s.at("final_train_loss").is_number())
      loss.push_back(s.at("final_train_loss").get<double>());
    if (s.contains("loopback_bytes") && s.at("loopback_bytes").is_number() && steps > 0)
      loopback.push_back(s.at("loopback_bytes").get<double>() / double(steps));
    if (s.contains("psi") && s.at("psi").is_number()) psi.push_back(s.at("psi").get<double>());
    if (s.contains("comm_ratio_to_psi") && s.at("comm_ratio_to_psi").is_number())
      ratio.push_back(s.at("comm_ratio_to_psi").get<double>());
    if (s.contains("matmul_peak_flops") && s.at("matmul_peak_flops").is_number())
      peak.push_back(s.at("matmul_peak_flops").get<double>());
  }
  r.psi = median_of(psi);
  r.comm_ratio_to_psi = median_of(ratio);
  r.matmul_peak_flops = median_of(peak);
  r.final_train_loss = median_of(loss);
  r.loopback_bytes_per_step = median_of(loopback);
  return r;
}

std::vector<CaseResult> aggregate_runs(const std::vector<BenchCase>& cases, const std::vector<CaseRun>& runs) {
  std::vector<CaseResult> results;
  for (const BenchCase& c : cases) {
    if (!c.skip_reason.empty()) {
      CaseResult r;
      r.bench_case = c;
      r.status = "skipped";
      r.error = c.skip_reason;
      results.push_back(r);
      continue;
    }
    std::vector<nlohmann::json> summaries;
    std::vector<double> step_tps, best_tps;
    std::string error;
    bool any = false;
    std::optional<PhaseSplit> phases;
    std::string phase_error;
    for (const auto& run : runs) {
      if (run.bench_case->name != c.name) continue;
      if (run.profiled) {  // untimed: only its split counts
        if (!run.error.empty()) {
          phase_error = "the profiled run " + run.error;
        } else if (run.summary.contains("phase_split")) {
          phases = PhaseSplit::from_json(run.summary.at("phase_split"));
          phase_error.clear();
        } else {
          phase_error = run.summary.value("phase_split_error", std::string("the profiled run wrote no split"));
        }
        continue;
      }
      any = true;
      if (!run.error.empty()) {
        error = "run " + std::to_string(run.repeat + 1) + " " + run.error;
        continue;
      }
      summaries.push_back(run.summary);
      if (run.median_step_tokens_per_s > 0) step_tps.push_back(run.median_step_tokens_per_s);
      if (run.best_step_tokens_per_s > 0) best_tps.push_back(run.best_step_tokens_per_s);
    }
    if (!any) continue;
    CaseResult r;
    if (!summaries.empty()) {
      r = aggregate(c, summaries, step_tps, best_tps);
    } else {
      r.bench_case = c;
      r.world_size = c.nproc;
    }
    if (!error.empty()) {
      r.status = "failed";
      r.error = error;
    }
    r.phases = phases;
    r.phase_error = phase_error;
    results.push_back(r);
  }
  return results;
}

}  // namespace strata::bench
