#include "strata/bench/planner_suite.h"

#include "strata/bench/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

namespace strata::bench {

namespace {
/// A case the planner suite runs: a strategy's plain case or one of its
/// spec's planner variants.
struct PlannerVariant {
  std::string label, strategy;
  std::vector<std::string> flags;
  std::string precision;
};

/// Each strategy's plain case and its planner variants, in registration order.
std::vector<PlannerVariant> planner_variants(const StrategyRegistry& strategies) {
  std::vector<PlannerVariant> variants;
  for (const auto* spec : strategies.specs()) {
    if (spec->max_world_size() == 1 || !spec->memory()) continue;
    variants.push_back({spec->name(), spec->name(), {}, "32"});
    for (const auto& v : spec->bench()) {
      if (std::find(v.suites.begin(), v.suites.end(), "planner") != v.suites.end())
        variants.push_back({spec->name() + "-" + v.tag, spec->name(), v.flags, v.precision});
    }
  }
  return variants;
}

/// Held out: shapes the planner's constants were not fitted on (other
/// widths, block sizes, batch sizes and world sizes), reported apart.
void add_held_out_cases(Suite& s, const std::vector<PlannerVariant>& variants) {
  // Each names the variant it runs by its position in planner_variants()
  // (the built-ins: 0 ddp, 1 oss, 2 sdp, 3 fsdp, 4 fsdp-ac), so strategies
  // registered after the built-ins leave these cases as they are.
  struct HeldOut {
    const char* preset;
    size_t variant;
    int nproc;
    int64_t block, batch;
    std::vector<std::string> extra;
  };
  const std::vector<HeldOut> held_out = {
      {"gpt-micro", 0, 2, 128, 8, {"--n-embd", "192"}},
      {"gpt-micro", 3, 2, 128, 8, {"--n-embd", "192"}},
      {"gpt-mini", 2, 2, 64, 16, {}},
      {"gpt-mini", 3, 2, 256, 4, {}},
      {"gpt-mini", 1, 3, 128, 8, {}},
      {"gpt-mini", 3, 4, 128, 4, {}},  // fsdp where N does not divide evenly: padding
      {"gpt-nano", 4, 3, 256, 4, {}},
      {"gpt-micro", 0, 4, 64, 8, {}},
      // Another family: RMSNorm, SwiGLU, RoPE and grouped queries, which the
      // constants never saw (the activations are its own probe's).
      {"llama-mini", 0, 2, 128, 8, {}},
      {"llama-mini", 3, 2, 128, 8, {}},
      {"llama-micro", 2, 3, 128, 8, {}},
      {"llama-mini", 4, 2, 256, 4, {}},
  };
  for (const HeldOut& h : held_out) {
    if (h.variant >= variants.size()) continue;  // fewer strategies registered
    const PlannerVariant& v = variants[h.variant];
    BenchCase c;
    const std::string width = h.extra.empty() ? "" : "-w" + h.extra[1];
    c.name = std::string(kHeldOutPrefix) + h.preset + width + "/" + v.label + "-" + std::to_string(h.nproc) +
             "x1-t" + std::to_string(h.block) + "-b" + std::to_string(h.batch);
    c.suite = "planner";
    c.preset = h.preset;
    c.strategy = v.strategy;
    c.extra = h.extra;
    c.extra.insert(c.extra.end(), v.flags.begin(), v.flags.end());
    c.precision = v.precision;
    c.nproc = h.nproc;
    c.threads_per_rank = 1;
    c.block_size = h.block;
    c.batch_size = h.batch;
    c.steps = 4;
    s.cases.push_back(c);
  }
}
}  // namespace

Suite planner_suite(const StrategyRegistry& strategies) {
  Suite s{"planner",
          "Memory planner: strata-gpt's predicted per-rank peak (model state by each strategy's memory model + "
          "activations probed on a 1- and a 2-block model of the family + what the strategy gathers + overhead) against "
          "the measured peak tensor bytes, 2 ranks x 1 thread, block 128, batch 8: every multi-rank strategy "
          "with a memory model, and the variants its spec puts here. Target: within 10%.",
          {}};
  const std::vector<PlannerVariant> variants = planner_variants(strategies);
  for (const char* preset : {"gpt-nano", "gpt-micro", "gpt-mini"}) {
    for (const auto& v : variants) {
      BenchCase c;
      c.name = std::string("planner/") + preset + "/" + v.label + "-2x1";
      c.suite = "planner";
      c.preset = preset;
      c.strategy = v.strategy;
      c.extra = v.flags;
      c.precision = v.precision;
      c.nproc = 2;
      c.threads_per_rank = 1;
      c.block_size = 128;
      c.batch_size = 8;
      c.steps = 4;
      s.cases.push_back(c);
    }
  }
  add_held_out_cases(s, variants);
  return s;
}

std::string planner_markdown(const std::vector<CaseRun>& runs) {
  struct Row {
    int64_t predicted = 0, measured = 0;
  };
  std::map<std::string, Row> rows;
  std::vector<std::string> order;
  for (const auto& run : runs) {
    const auto& s = run.summary;
    // A profiled run's peak includes the profiler's: not a measurement of the plan.
    if (run.profiled || !s.contains("predicted_peak_bytes") || run.bench_case == nullptr) continue;
    const std::string& name = run.bench_case->name;
    if (!rows.count(name)) order.push_back(name);
    Row& row = rows[name];
    row.predicted = s.at("predicted_peak_bytes").get<int64_t>();
    for (const auto& v : s.at("peak_tensor_bytes")) row.measured = std::max(row.measured, v.get<int64_t>());
  }
  if (order.empty()) return "";
  std::ostringstream out;
  out << "\n### planner: predicted vs measured peak per rank\n\n"
      << "| case | predicted | measured | error |\n|---|---:|---:|---:|\n";
  double worst = 0.0, worst_held_out = 0.0;
  bool any_held_out = false;
  for (const auto& name : order) {
    const Row& r = rows[name];
    const double error = r.measured > 0 ? double(r.predicted) / double(r.measured) - 1.0 : 0.0;
    const bool held_out = name.rfind(kHeldOutPrefix, 0) == 0;
    any_held_out |= held_out;
    (held_out ? worst_held_out : worst) = std::max(held_out ? worst_held_out : worst, std::abs(error));
    char pct[32];
    std::snprintf(pct, sizeof(pct), "%+.1f%%", 100.0 * error);
    out << "| " << name << " | " << format_mib(double(r.predicted)) << " | " << format_mib(double(r.measured))
        << " | " << pct << " |\n";
  }
  char line[160];
  std::snprintf(line, sizeof(line), "\nmax |error|: %.1f%% on the cases the constants were fitted on (target 10%%)",
                100.0 * worst);
  out << line;
  if (any_held_out) {
    std::snprintf(line, sizeof(line), "; %.1f%% on the held-out cases (%s*)", 100.0 * worst_held_out, kHeldOutPrefix);
    out << line;
  }
  out << "\n";
  return out.str();
}

}  // namespace strata::bench
