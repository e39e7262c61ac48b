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

/// One planner case: `variant` on `preset`, `nproc` ranks x 1 thread, a few
/// steps (memory is exact).
BenchCase planner_case(const std::string& name, const std::string& preset, const PlannerVariant& variant, int nproc,
                       int64_t block, int64_t batch, std::vector<std::string> model_flags) {
  BenchCase c;
  c.name = name;
  c.suite = "planner";
  c.preset = preset;
  c.strategy = variant.strategy;
  c.model_flags = std::move(model_flags);
  c.extra = variant.flags;
  c.precision = variant.precision;
  c.nproc = nproc;
  c.threads_per_rank = 1;
  c.block_size = block;
  c.batch_size = batch;
  c.steps = 4;
  return c;
}

/// Held out: shapes the planner's constants were not fitted on (other
/// widths, block sizes, batch sizes and world sizes; other families), each
/// family's own (BenchWorkloads::planner_held_out), reported apart. Each names
/// the variant it runs by position, so strategies registered after the
/// built-ins leave these cases as they are.
void add_held_out_cases(Suite& s, const std::vector<PlannerVariant>& variants, const recipes::ModelRegistry& models) {
  for (const auto* family : models.specs()) {
    for (const auto& h : family->bench().planner_held_out) {
      if (h.variant >= variants.size()) continue;  // fewer strategies registered
      const PlannerVariant& v = variants[h.variant];
      const std::string name = std::string(kHeldOutPrefix) + h.preset + (h.tag.empty() ? "" : "-" + h.tag) + "/" +
                               v.label + "-" + std::to_string(h.nproc) + "x1-t" + std::to_string(h.block) + "-b" +
                               std::to_string(h.batch);
      s.cases.push_back(planner_case(name, h.preset, v, h.nproc, h.block, h.batch, h.flags));
    }
  }
}
}  // namespace

Suite planner_suite(const StrategyRegistry& strategies, const recipes::ModelRegistry& models) {
  Suite s{"planner",
          "Memory planner: strata-gpt's predicted per-rank peak (model state by each strategy's memory model + "
          "activations probed on a 1- and a 2-block model of the family + what the strategy gathers + overhead) against "
          "the measured peak tensor bytes, 2 ranks x 1 thread, block 128, batch 8: every multi-rank strategy "
          "with a memory model, and the variants its spec puts here. Target: within 10%.",
          {}};
  const std::vector<PlannerVariant> variants = planner_variants(strategies);
  for (const std::string& preset : models.bench_family().bench().planner) {
    for (const auto& v : variants) {
      s.cases.push_back(planner_case("planner/" + preset + "/" + v.label + "-2x1", preset, v, 2, 128, 8, {}));
    }
  }
  add_held_out_cases(s, variants, models);
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
