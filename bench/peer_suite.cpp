#include "strata/bench/peer_suite.h"

#include "strata/bench/report.h"

#include <c10/util/StringUtil.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>

namespace strata::bench {
namespace {

constexpr const char* kSuite = "peer";
constexpr int64_t kSteps = 15;  ///< the first (compilation, warm-up) is not timed

/// One job: what strata and the peer both run.
struct PeerJob {
  std::string shape;     ///< the preset, or the preset and the wide tag ("<preset>-384")
  std::string preset;    ///< its preset
  std::string strategy;  ///< strata's name
  std::string peer_mode; ///< gpt_peer.py's --mode (StrategySpec::pytorch_peer)
  int nproc, threads;
  std::string precision;
  bool ac;
  int64_t batch, block;
  std::vector<std::string> model;  ///< shape flags for both programs
  std::string ac_policy = "full";  ///< with ac: --ac-policy of both programs
  /// The shared initial weights: "pt" (gpt_peer.py's torch.save file under
  /// nanoGPT's names) or "hf" (a transformers directory both programs load).
  std::string init_format = "pt";
  std::string label() const {
    return strategy + "-" + std::to_string(nproc) + "x" + std::to_string(threads) + "-" +
           (precision == "32" ? "fp32" : "bf16") + (ac ? "-ac" : "") + (ac && ac_policy != "full" ? "-" + ac_policy : "");
  }
};

BenchCase job_case(const PeerJob& job, const std::string& system) {
  BenchCase c;
  c.suite = kSuite;
  c.name = std::string(kSuite) + "/" + job.shape + "/" + job.label() + "/" + system;
  c.preset = job.preset;
  c.strategy = job.strategy;
  c.nproc = job.nproc;
  c.threads_per_rank = job.threads;
  c.precision = job.precision;
  c.steps = kSteps;
  c.batch_size = job.batch;
  c.block_size = job.block;
  c.shared_init = true;
  c.shared_init_format = job.init_format;
  c.phase_split = true;  // issue 35: where each program's step goes
  c.model_flags = job.model;
  if (job.ac) c.extra.insert(c.extra.end(), {"--activation-checkpointing", "1"});
  if (job.ac && job.ac_policy != "full") c.extra.insert(c.extra.end(), {"--ac-policy", job.ac_policy});
  if (system == "strata") {
    c.reference = std::string(kSuite) + "/" + job.shape + "/" + job.label() + "/pytorch-eager";
  } else {
    c.program = "peer";
    c.peer_mode = job.peer_mode;
    if (system == "pytorch-compile") c.extra.push_back("--compile");
  }
  return c;
}

/// Whether `mode` is among `modes` ({}: every mode is).
bool among(const std::vector<std::string>& modes, const std::string& mode) {
  return modes.empty() || std::find(modes.begin(), modes.end(), mode) != modes.end();
}

/// A family's peer jobs (BenchWorkloads::peer), for every strategy with a
/// PyTorch counterpart (StrategySpec::pytorch_peer) that the family's peer
/// runs: one process x 2 threads where it runs one, else 2 ranks x 1 thread;
/// fp32 and bf16-mixed; fp32 with activation checkpointing for the modes it
/// names; the single-process one with op-level selective checkpointing
/// (torchtitan's policy in both) and on the widened model at block 256 when
/// it asks.
void add_family_jobs(std::vector<PeerJob>& out, const StrategyRegistry& registry,
                     const recipes::BenchWorkloads& bench) {
  const recipes::PeerWorkload& peer = bench.peer;
  std::vector<std::tuple<std::string, std::string, int, int>> strategies;
  for (const auto* spec : registry.specs()) {
    if (spec->pytorch_peer().empty() || !among(peer.modes, spec->pytorch_peer())) continue;
    const bool one = spec->max_world_size() == 1;
    strategies.emplace_back(spec->name(), spec->pytorch_peer(), one ? 1 : 2, one ? 2 : 1);
  }
  auto job = [&](const std::string& strategy, const std::string& mode, int nproc, int threads,
                 const std::string& precision, bool ac) {
    return PeerJob{peer.preset, peer.preset, strategy, mode, nproc, threads, precision, ac, 8, 128, {}, "full",
                   peer.init_format};
  };
  for (const std::string precision : {"32", "bf16-mixed"})
    for (const auto& [strategy, mode, nproc, threads] : strategies)
      out.push_back(job(strategy, mode, nproc, threads, precision, false));
  for (const auto& [strategy, mode, nproc, threads] : strategies)
    if (among(peer.ac_modes, mode)) out.push_back(job(strategy, mode, nproc, threads, "32", true));
  const StrategySpec* single = registry.single_process();
  if (single == nullptr || single->pytorch_peer().empty() || !among(peer.modes, single->pytorch_peer())) return;
  if (peer.op_sac) {
    out.push_back(job(single->name(), single->pytorch_peer(), 1, 2, "32", true));
    out.back().ac_policy = "op";
  }
  if (peer.wide && !bench.wide_flags.empty()) {
    for (const std::string precision : {"32", "bf16-mixed"}) {
      out.push_back(job(single->name(), single->pytorch_peer(), 1, 2, precision, false));
      PeerJob& wide = out.back();
      wide.shape = peer.preset + "-" + bench.wide_tag;
      wide.batch = 4;
      wide.block = 256;
      wide.model = bench.wide_flags;
    }
  }
}

/// Every registered family's peer jobs, in registration order.
std::vector<PeerJob> jobs(const StrategyRegistry& registry, const recipes::ModelRegistry& models) {
  std::vector<PeerJob> out;
  for (const auto* family : models.specs()) {
    if (!family->bench().peer.preset.empty()) add_family_jobs(out, registry, family->bench());
  }
  return out;
}

std::string mib(double bytes) { return fixed(bytes / (1024.0 * 1024.0), 0); }

/// The chart panel a job belongs to, and its row there.
std::pair<std::string, std::string> panel_and_row(const PeerJob& job) {
  const std::string precision = job.precision == "32" ? "fp32" : "bf16-mixed";
  if (job.block != 128) return {job.shape + ", block " + std::to_string(job.block) + ", single 1x2", precision};
  std::string row = job.nproc == 1 ? job.strategy + " 1x2" : job.strategy + " x2";
  // Short: the panel's bars are narrow ("single 1x2" with --ac-policy op).
  if (job.ac && job.ac_policy != "full") row = job.ac_policy + " SAC";
  return {job.shape + ", " + precision + (job.ac ? " + AC" : ""), row};
}

/// The results of one job by system ("strata", "pytorch-eager", "pytorch-compile").
std::map<std::string, const CaseResult*> job_results(const PeerJob& job,
                                                      const std::map<std::string, const CaseResult*>& by_name) {
  std::map<std::string, const CaseResult*> out;
  const std::string stem = std::string(kSuite) + "/" + job.shape + "/" + job.label() + "/";
  for (const char* system : {"strata", "pytorch-eager", "pytorch-compile"}) {
    const auto it = by_name.find(stem + system);
    if (it != by_name.end() && it->second->status == "ok") out[system] = it->second;
  }
  return out;
}

std::string tps_cell(const CaseResult* r) {
  if (r == nullptr || r->status != "ok") return r ? r->status : "–";
  std::string s = fixed(r->tokens_per_s.median, 0);
  if (r->runs > 1) s += " (" + fixed(r->tokens_per_s.min, 0) + "–" + fixed(r->tokens_per_s.max, 0) + ")";
  return s;
}

}  // namespace

double peer_loss_tolerance(const std::string& precision) { return precision == "32" ? 1e-3 : 3e-2; }

Suite peer_suite(const StrategyRegistry& registry, const recipes::ModelRegistry& models) {
  Suite s{kSuite,
          "strata against the PyTorch 2.x program for the same job (bench/peers/gpt_peer.py: "
          "DistributedDataParallel, ZeroRedundancyOptimizer, FSDP2 fully_shard, SDPA, fused AdamW; eager "
          "and torch.compile; the Llama jobs with transformers' LlamaForCausalLM), same model, data, global "
          "batch, initial weights and threads, " +
              std::to_string(kSteps) +
              " steps (the first untimed). vs ref: strata ÷ PyTorch eager; the peer table divides by the "
              "faster of eager and compiled.",
          {}};
  for (const PeerJob& job : jobs(registry, models))
    for (const char* system : {"strata", "pytorch-eager", "pytorch-compile"}) s.cases.push_back(job_case(job, system));
  return s;
}

namespace {

/// A chart of the peer jobs: each bar the system's tokens/s (median) ÷ the
/// job's `divisor` (0: the job is left out).
PanelChart peer_panels(const std::vector<CaseResult>& results, const StrategyRegistry& registry,
                       const recipes::ModelRegistry& models, const std::string& ylabel, const std::string& what,
                       const std::function<double(const std::map<std::string, const CaseResult*>&)>& divisor) {
  std::map<std::string, const CaseResult*> by_name;
  for (const auto& r : results) by_name[r.bench_case.name] = &r;
  PanelChart chart;
  chart.strategies = {"strata", "PyTorch eager", "PyTorch compiled"};
  chart.ylabel = ylabel;
  std::map<std::string, std::string> blocks;  // panel -> rows
  std::map<std::string, int> rows;             // panel -> how many
  for (const PeerJob& job : jobs(registry, models)) {
    const auto found = job_results(job, by_name);
    const double unit = divisor(found);
    if (unit <= 0.0) continue;
    const auto [panel, row] = panel_and_row(job);
    if (std::find(chart.panels.begin(), chart.panels.end(), panel) == chart.panels.end()) chart.panels.push_back(panel);
    std::string line = "\"" + row + "\"";
    for (const char* system : {"strata", "pytorch-eager", "pytorch-compile"})
      line += found.count(system) ? c10::str(" ", fixed(found.at(system)->tokens_per_s.median / unit, 4)) : " ?";
    blocks[panel] += line + "\n";
    // More than four clusters in a panel: wider panels, slanted labels.
    if (++rows[panel] > 4) chart.long_labels = true;
  }
  std::ostringstream out;
  out << "# one block per panel; columns: tokens/s (median) ÷ " << what << " ('?' = did not run)\n";
  for (size_t p = 0; p < chart.panels.size(); ++p) {
    if (p > 0) out << "\n\n";
    out << "# panel " << p << ": " << chart.panels[p] << "\n\"job\" \"strata\" \"PyTorch eager\" \"PyTorch compiled\"\n"
        << blocks[chart.panels[p]];
  }
  chart.data = out.str();
  return chart;
}

}  // namespace

PanelChart peer_chart_data(const std::vector<CaseResult>& results, const StrategyRegistry& registry,
                          const recipes::ModelRegistry& models) {
  return peer_panels(results, registry, models, "tokens/s ÷ the faster PyTorch", "the faster PyTorch's", [](const auto& found) {
    double best = 0.0;
    for (const char* p : {"pytorch-eager", "pytorch-compile"})
      if (found.count(p)) best = std::max(best, found.at(p)->tokens_per_s.median);
    return best;
  });
}

PanelChart peer_ceiling_chart_data(const std::vector<CaseResult>& results, const StrategyRegistry& registry,
                          const recipes::ModelRegistry& models) {
  PanelChart chart = peer_panels(results, registry, models, "share of the GEMM-bound ceiling", "the job's GEMM-bound ceiling",
                                 [](const auto& found) {
                                   const auto s = found.find("strata");
                                   if (s == found.end() || s->second->ceiling_share <= 0.0) return 0.0;
                                   return s->second->tokens_per_s.median / s->second->ceiling_share;  // tokens/s
                                 });
  chart.ymax = 1.0;  // the ceiling itself, the dashed line
  return chart;
}

std::string peer_markdown(const std::vector<CaseResult>& results, const StrategyRegistry& registry,
                          const recipes::ModelRegistry& models) {
  std::map<std::string, const CaseResult*> by_name;
  for (const auto& r : results) by_name[r.bench_case.name] = &r;
  std::ostringstream out;
  out << "\n### strata vs PyTorch 2.x\n\n"
         "| job | strata tokens/s | PyTorch eager | PyTorch compiled | strata ÷ faster PyTorch (range) "
         "| share of GEMM ceiling strata / PyTorch "
         "| peak RSS/rank MiB strata / PyTorch | loopback KiB/step strata / PyTorch "
         "| final loss strata / PyTorch (agree?) |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const PeerJob& job : jobs(registry, models)) {
    const std::string stem = std::string(kSuite) + "/" + job.shape + "/" + job.label() + "/";
    auto find = [&](const std::string& system) {
      const auto it = by_name.find(stem + system);
      return it == by_name.end() ? nullptr : it->second;
    };
    const CaseResult *s = find("strata"), *eager = find("pytorch-eager"), *compiled = find("pytorch-compile");
    if (!s && !eager && !compiled) continue;
    auto ok = [](const CaseResult* r) { return r && r->status == "ok"; };
    // The faster PyTorch by median; its min and max bound the ratio's range.
    const CaseResult* best = nullptr;
    for (const CaseResult* p : {eager, compiled})
      if (ok(p) && (!best || p->tokens_per_s.median > best->tokens_per_s.median)) best = p;
    std::string ratio = "–";
    if (ok(s) && best) {
      ratio = fixed(s->tokens_per_s.median / best->tokens_per_s.median, 2) + "× (" +
              fixed(s->tokens_per_s.min / best->tokens_per_s.max, 2) + "–" +
              fixed(s->tokens_per_s.max / best->tokens_per_s.min, 2) + ")";
    }
    // The same model, shape, precision and ranks: one ceiling (strata's summary.json's).
    std::string ceiling = "–";
    if (ok(s) && s->ceiling_share > 0) {
      const double tokens = s->tokens_per_s.median / s->ceiling_share;
      ceiling = fixed(100.0 * s->ceiling_share, 1) + "% / " +
                (best ? fixed(100.0 * best->tokens_per_s.median / tokens, 1) + "%" : std::string("–"));
    }
    auto rss = [&](const CaseResult* r) { return ok(r) && r->peak_rss_bytes_max > 0 ? mib(double(r->peak_rss_bytes_max)) : "–"; };
    auto lo = [&](const CaseResult* r) {
      return ok(r) && r->loopback_bytes_per_step ? fixed(*r->loopback_bytes_per_step / 1024.0, 0) : "–";
    };
    std::string loss = "–";
    if (ok(s) && best && s->final_train_loss && best->final_train_loss) {
      const double diff = std::abs(*s->final_train_loss - *best->final_train_loss);
      const bool agree = diff <= peer_loss_tolerance(job.precision);
      loss = fixed(*s->final_train_loss, 4) + " / " + fixed(*best->final_train_loss, 4) + " (|Δ| " +
             fixed(diff, 5) + (agree ? " ✓)" : " ✗ void)");
    }
    out << "| " << job.shape << " " << job.label() << " | " << tps_cell(s) << " | " << tps_cell(eager) << " | "
        << tps_cell(compiled) << " | " << ratio << " | " << ceiling << " | " << rss(s) << " / " << rss(best) << " | " << lo(s) << " / "
        << lo(best) << " | " << loss << " |\n";
  }
  out << "\nLosses agree when |Δ| ≤ " << fixed(peer_loss_tolerance("32"), 4) << " (fp32) or "
      << fixed(peer_loss_tolerance("bf16-mixed"), 2)
      << " (bf16-mixed) after the same steps from the same weights; PyTorch's columns are the faster of eager "
         "and compiled.\n";
  return out.str();
}

}  // namespace strata::bench
