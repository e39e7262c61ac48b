// The built-in suites (what each measures and compares) and the registry
// that selects them by name. Running them: runner.cpp; their numbers:
// aggregate.cpp.
#include "strata/bench/harness.h"
#include "strata/bench/peer_suite.h"
#include "strata/bench/planner_suite.h"
#include "strata/bench/pp_suite.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <tuple>
#include <set>
#include <sstream>

namespace strata::bench {

namespace {

using recipes::BenchWorkload;
using recipes::BenchWorkloads;

// Block 128 on the generated text gives realistically shaped matmuls (the
// addition task's 11 tokens would not); the workload sizes batch and steps.
BenchCase make_case(const std::string& suite, const BenchWorkload& model, const std::string& variant,
                    const std::string& strategy, int nproc, int threads) {
  BenchCase c;
  c.name = suite + "/" + model.preset + "/" + variant;
  c.suite = suite;
  c.preset = model.preset;
  c.strategy = strategy;
  c.nproc = nproc;
  c.threads_per_rank = threads;
  c.block_size = 128;
  c.steps = model.steps;
  c.batch_size = model.batch;
  return c;
}

/// One case of a suite table: what differs from make_case's defaults. The
/// case is named "<suite>/<preset>/<variant>"; `reference` names the variant
/// (same preset) whose case its "vs ref" columns divide by.
struct CaseRow {
  BenchWorkload model;
  std::string variant, strategy;
  int nproc = 2;
  int threads = 1;
  std::string precision = "32";
  std::vector<std::string> model_flags = {};  ///< the family's own (a width)
  std::vector<std::string> extra = {};
  std::string reference = "";
  int64_t batch = 0, block = 0, steps = 0;  ///< 0: make_case's
};

Suite table_suite(const std::string& name, const std::string& about, const std::vector<CaseRow>& rows) {
  Suite s{name, about, {}};
  for (const CaseRow& row : rows) {
    BenchCase c = make_case(name, row.model, row.variant, row.strategy, row.nproc, row.threads);
    c.precision = row.precision;
    c.model_flags = row.model_flags;
    c.extra = row.extra;
    if (!row.reference.empty()) c.reference = name + "/" + row.model.preset + "/" + row.reference;
    if (row.batch > 0) c.batch_size = row.batch;
    if (row.block > 0) c.block_size = row.block;
    if (row.steps > 0) c.steps = row.steps;
    s.cases.push_back(c);
  }
  return s;
}

/// "<name>[-<tag>]-<N>x<threads>": a strategy's case, plain or a variant.
std::string case_label(const std::string& strategy, const std::string& tag, int nproc, int threads) {
  return strategy + (tag.empty() ? "" : "-" + tag) + "-" + std::to_string(nproc) + "x" + std::to_string(threads);
}

bool multi_rank(const StrategySpec& spec) { return spec.max_world_size() != 1; }

/// One strategy's suite (named after it): on the small and medium workload, its plain
/// case and its bench variants. A multi-rank strategy runs 2 ranks x 1 thread
/// and is compared with the reference strategy's plain case; the reference
/// itself with the single-process strategy as 1 rank x 2 threads at twice the
/// batch (the same global batch); a single-process strategy runs 1 x 2.
/// Variants are compared with their plain case (or the variant they name).
Suite strategy_suite(const StrategyRegistry& strategies, const BenchWorkloads& w, const StrategySpec& spec) {
  const StrategySpec* reference = strategies.reference();
  const StrategySpec* single = strategies.single_process();
  const bool multi = multi_rank(spec);
  const int nproc = multi ? 2 : 1, threads = multi ? 1 : 2;
  std::string about = spec.name() + ": " + spec.description() + ". " + std::to_string(nproc) + " rank(s) x " +
                      std::to_string(threads) + " thread(s).";
  std::vector<CaseRow> rows;
  for (const BenchWorkload& preset : {w.small, w.medium}) {
    const std::string plain = case_label(spec.name(), "", nproc, threads);
    std::string plain_ref;
    if (multi && reference && reference != &spec) {
      plain_ref = case_label(reference->name(), "", 2, 1);
      rows.push_back({.model = preset, .variant = plain_ref, .strategy = reference->name()});
    } else if (multi && single) {
      // The same global batch: make_case's per-rank batch on each of 2 ranks.
      plain_ref = case_label(single->name(), "", 1, 2);
      rows.push_back({.model = preset, .variant = plain_ref, .strategy = single->name(), .nproc = 1, .threads = 2,
                      .batch = 2 * preset.batch});
    }
    rows.push_back({.model = preset, .variant = plain, .strategy = spec.name(), .nproc = nproc, .threads = threads,
                    .reference = plain_ref});
    for (const BenchVariant& v : spec.bench()) {
      rows.push_back({.model = preset, .variant = case_label(spec.name(), v.tag, nproc, threads),
                      .strategy = spec.name(), .nproc = nproc, .threads = threads, .precision = v.precision,
                      .extra = v.flags,
                      .reference = v.reference.empty() ? plain : case_label(spec.name(), v.reference, nproc, threads)});
    }
  }
  if (multi && reference && reference != &spec) {
    about += " The plain case ÷ " + reference->name() + " (vs ref).";
  } else if (multi && single) {
    about += " The plain case ÷ " + single->name() + " as 1 rank x 2 threads at the same global batch (vs ref).";
  }
  for (const BenchVariant& v : spec.bench()) about += " " + v.tag + ": " + v.about + ".";
  about += " vs ref: variants ÷ their plain case.";
  return table_suite(spec.name(), about, rows);
}

/// Every multi-rank strategy's plain case on the medium workload x2, against the reference.
Suite zero_suite(const StrategyRegistry& strategies, const BenchWorkloads& w) {
  const StrategySpec* reference = strategies.reference();
  const std::string ref = reference ? case_label(reference->name(), "", 2, 1) : "";
  std::vector<CaseRow> rows;
  for (const auto* spec : strategies.specs()) {
    if (!multi_rank(*spec)) continue;
    const std::string label = case_label(spec->name(), "", 2, 1);
    rows.push_back({.model = w.medium, .variant = label, .strategy = spec->name(),
                    .reference = label == ref ? "" : ref});
  }
  return table_suite("zero",
                     w.medium.preset + ", 2 ranks x 1 thread, every strategy that runs several ranks. state/model: measured "
                     "model-state bytes per rank ÷ the strategy's memory model (fp32 AdamW: ddp 16Ψ', oss "
                     "8Ψ'+8Ψ'/N, sdp 4Ψ'+12Ψ'/N, fsdp 16Ψ'/N); expect 1.00 within 5% plus bucket buffers. vs ref: ÷ " +
                         (reference ? reference->name() : std::string("—")) + ".",
                     rows);
}

/// Whether `spec`'s model state per rank shrinks with more ranks (its memory
/// model, fp32 AdamW, on a nominal model).
bool shards_state(const StrategySpec& spec) {
  if (!spec.memory()) return false;
  MemoryQuery q;
  q.model = {.params = 1 << 20, .trainable = 1 << 20, .units = 4, .unit_params = 1 << 18, .unit_trainable = 1 << 18};
  q.args = spec.parse_args();
  const auto one = spec.memory()(q);
  q.world_size = q.local_world_size = 2;
  const auto two = spec.memory()(q);
  return one && two && two->model_state() < one->model_state();
}

Suite memory_suite(const StrategyRegistry& strategies, const BenchWorkloads& w) {
  std::vector<CaseRow> rows;
  for (const auto* spec : strategies.specs()) {
    if (!multi_rank(*spec) || !shards_state(*spec)) continue;
    for (int n : {1, 2, 4}) {
      rows.push_back({.model = w.medium, .variant = spec->name() + "-n" + std::to_string(n),
                      .strategy = spec->name(), .nproc = n,
                      .reference = n == 1 ? "" : spec->name() + "-n1", .steps = 8});
    }
  }
  return table_suite("memory",
                     w.medium.preset + ", N ranks x 1 thread, batch " + std::to_string(w.medium.batch) +
                         " per rank, a few steps, every strategy whose model state "
                     "per rank shrinks with N (its memory model): memory is exact, tokens/s are incidental (N=4 "
                     "puts 4 ranks on 2 cores). peak vs ref: peak tensor bytes per rank ÷ the same strategy at N=1.",
                     rows);
}

/// The variants of `spec` that join built-in suite `suite`.
std::vector<BenchVariant> variants_in(const StrategySpec& spec, const std::string& suite) {
  std::vector<BenchVariant> out;
  for (const auto& v : spec.bench()) {
    if (std::find(v.suites.begin(), v.suites.end(), suite) != v.suites.end()) out.push_back(v);
  }
  return out;
}

Suite smoke_suite(const StrategyRegistry& strategies, const BenchWorkloads& w) {
  // The tiny workload at block 64.
  auto row = [&](const std::string& variant, const std::string& strategy, int nproc, std::vector<std::string> extra,
                 const std::string& reference, const std::string& precision = "32") {
    return CaseRow{.model = w.tiny, .variant = variant, .strategy = strategy, .nproc = nproc,
                   .precision = precision, .extra = std::move(extra), .reference = reference, .block = 64};
  };
  const StrategySpec* reference = strategies.reference();
  const StrategySpec* single = strategies.single_process();
  const std::string ref = reference ? case_label(reference->name(), "", 2, 1) : "";
  const std::string single_ref = single ? case_label(single->name(), "", 1, 1) : "";
  std::vector<CaseRow> rows;
  for (const auto* spec : strategies.specs()) {
    const bool multi = multi_rank(*spec);
    const std::string plain = case_label(spec->name(), "", multi ? 2 : 1, 1);
    rows.push_back(row(plain, spec->name(), multi ? 2 : 1, {}, !multi ? "" : plain == ref ? single_ref : ref));
    for (const auto& v : variants_in(*spec, "smoke")) {
      rows.push_back(row(case_label(spec->name(), v.tag, multi ? 2 : 1, 1), spec->name(), multi ? 2 : 1, v.flags,
                         multi ? ref : plain, v.precision));
    }
  }
  return table_suite(
      "smoke",
      "CI regression gate: every registered strategy on " + w.tiny.preset + ", at 2 ranks (one process where a strategy runs "
      "only one), with the variants its spec puts in the gate; block 64, batch 8 per rank, a few steps, 1 thread "
      "per process (" + w.tiny.preset + "'s tiny matmuls on 2 threads slow down several-fold on a loaded machine, which would "
      "make the gate flaky). vs ref: the reference strategy ÷ the single-process one (ideal 2.0), the others ÷ "
      "the reference.",
      rows);
}

Suite scale_suite(const StrategyRegistry& strategies, const BenchWorkloads& w) {
  TORCH_CHECK_VALUE(!w.scale.empty(), "the scale suite's model family gives no scale presets (BenchWorkloads::scale)");
  Suite s{"scale",
          "Slow, not in CI. The largest preset each strategy fits, per world size: every preset from " +
              w.scale.front() + " to " + w.scale.back() + " under every multi-rank strategy (and the variants its spec puts here, e.g. fsdp "
          "--offload disk) at N = 1, 2 and 4 ranks x 1 thread, batch 1 per rank, block 128, 3 steps. A case "
          "that runs out of memory (or time) is recorded as failed and the sweep goes on; the largest preset "
          "that ran per strategy and N is listed under the table. peak vs ref: ÷ the same preset under the "
          "reference strategy.",
          {}};
  const StrategySpec* reference = strategies.reference();
  for (int n : {1, 2, 4}) {
    for (const std::string& preset : w.scale) {
      const std::string ref = reference ? "scale/" + preset + "/" + reference->name() + "-n" + std::to_string(n) : "";
      for (const auto* spec : strategies.specs()) {
        if (!multi_rank(*spec)) continue;
        std::vector<BenchVariant> runs = {BenchVariant{}};  // the plain case, then the variants
        for (const auto& v : variants_in(*spec, "scale")) runs.push_back(v);
        for (const auto& v : runs) {
          const std::string variant = spec->name() + (v.tag.empty() ? "" : "-" + v.tag);
          BenchCase c = make_case("scale", {preset}, variant + "-n" + std::to_string(n), spec->name(), n, 1);
          c.batch_size = 1;
          c.steps = 3;
          c.extra = v.flags;
          c.precision = v.precision;
          if (c.name != ref) c.reference = ref;
          s.cases.push_back(c);
        }
      }
    }
  }
  return s;
}

/// Tensor parallelism (--tp-size 2, sequence parallel) beside each strategy
/// that composes with it (StrategySpec::tensor_parallel), on the medium workload: at 4
/// ranks every such multi-rank strategy plain and over 2 data-parallel
/// groups of tp 2, at the same global batch; and pure tp 2 (the
/// single-process strategy over 2 ranks) against the reference strategy at 2.
Suite tp_suite(const StrategyRegistry& strategies, const BenchWorkloads& w) {
  const StrategySpec* reference = strategies.reference();
  const StrategySpec* single = strategies.single_process();
  const int64_t batch = w.medium.batch;
  const std::vector<std::string> tp = {"--tp-size", "2", "--sequence-parallel"};
  std::vector<CaseRow> rows;
  if (reference != nullptr && single != nullptr && single->tensor_parallel()) {
    const std::string ref = case_label(reference->name(), "", 2, 1);
    rows.push_back({.model = w.medium, .variant = ref, .strategy = reference->name()});
    rows.push_back({.model = w.medium, .variant = case_label(single->name(), "tp2", 2, 1),
                    .strategy = single->name(), .extra = tp, .reference = ref, .batch = 2 * batch});
  }
  for (const auto* spec : strategies.specs()) {
    if (!multi_rank(*spec) || !spec->tensor_parallel()) continue;
    const std::string plain = case_label(spec->name(), "", 4, 1);
    rows.push_back({.model = w.medium, .variant = plain, .strategy = spec->name(), .nproc = 4});
    rows.push_back({.model = w.medium, .variant = case_label(spec->name(), "tp2", 4, 1), .strategy = spec->name(),
                    .nproc = 4, .extra = tp, .reference = plain, .batch = 2 * batch});
  }
  return table_suite("tp",
                     "Tensor parallelism (--tp-size 2 --sequence-parallel) on " + w.medium.preset + ", 1 thread per rank, at the "
                     "same global batch (" + std::to_string(batch) + " per data-parallel rank without tp, " +
                         std::to_string(2 * batch) + " with): pure tp over 2 ranks against the reference "
                         "strategy, and at 4 ranks each strategy that composes with tp, plain and over 2 groups "
                         "of tp 2. vs ref: the tp case ÷ its reference.",
                     rows);
}

Suite attention_suite(const StrategyRegistry& strategies, const BenchWorkloads& w) {
  const std::string single = strategies.single_process() ? strategies.single_process()->name() : "";
  std::vector<CaseRow> rows;
  for (int64_t block : {256, 1024}) {
    for (const std::string precision : {"32", "bf16-mixed"}) {
      const std::string tag = std::string(precision == "32" ? "fp32" : "bf16") + "-t" + std::to_string(block);
      const int64_t batch = block == 256 ? 8 : 2;  // the same tokens per step
      for (const std::string attention : {"naive", "fused"}) {
        rows.push_back({.model = w.medium, .variant = attention + "-" + tag, .strategy = single, .nproc = 1,
                        .threads = 2, .precision = precision, .extra = {"--attention", attention},
                        .reference = attention == "fused" ? "naive-" + tag : "", .batch = batch, .block = block,
                        .steps = 20});
      }
    }
  }
  return table_suite("attention",
                     w.medium.preset + ", one process x 2 threads, --attention naive vs fused (kernels/attention.h) at "
                     "block 256 and 1024, fp32 and bf16-mixed. vs ref: fused ÷ naive at the same block size "
                     "and precision (tokens/s; peak: tensor bytes).",
                     rows);
}

Suite kernels_suite(const StrategyRegistry& strategies, const BenchWorkloads& w) {
  std::vector<CaseRow> rows;
  const std::string single = strategies.single_process() ? strategies.single_process()->name() : "";
  const std::string reference = strategies.reference() ? strategies.reference()->name() : "";
  std::vector<std::tuple<std::string, std::string, int, int, std::vector<std::string>>> shapes = {
      {single + "-1x2", single, 1, 2, {}}, {reference + "-2x1", reference, 2, 1, {}}};
  if (!w.wide_flags.empty()) shapes.emplace_back(w.wide_tag + "-" + single + "-1x2", single, 1, 2, w.wide_flags);
  for (const auto& [tag, strategy, nproc, threads, model] : shapes) {
    rows.push_back({.model = w.medium, .variant = "unfused-" + tag, .strategy = strategy, .nproc = nproc,
                    .threads = threads, .model_flags = model, .extra = {"--attention", "naive", "--fused-adamw", "false"},
                    .batch = 8, .block = 256, .steps = 20});
    rows.push_back({.model = w.medium, .variant = "fused-" + tag, .strategy = strategy, .nproc = nproc,
                    .threads = threads, .model_flags = model, .reference = "unfused-" + tag, .batch = 8, .block = 256,
                    .steps = 20});
  }
  return table_suite("kernels",
                     "Both fused kernels (--attention fused, --fused-adamw true: the defaults) against both "
                     "off (--attention naive --fused-adamw false), block 256, batch 8 per rank: " +
                         w.medium.preset + " as one process x 2 threads and as " + reference +
                         " 2 ranks x 1 thread, and " + w.medium.preset + " widened (" + c10::Join(" ", w.wide_flags) +
                         ") as one process. vs ref: fused ÷ unfused.",
                     rows);
}

}  // namespace

void SuiteRegistry::add(const std::string& name, Factory factory) {
  TORCH_CHECK_VALUE(!name.empty() && name.find(',') == std::string::npos,
                    "SuiteRegistry::add: a suite name must be non-empty and without ',', got '", name, "'");
  for (const auto& entry : entries_)
    TORCH_CHECK_VALUE(entry.first != name, "SuiteRegistry::add: suite '", name, "' is already registered");
  TORCH_CHECK_VALUE(factory != nullptr, "SuiteRegistry::add: suite '", name, "' has no factory");
  entries_.emplace_back(name, std::move(factory));
}

std::vector<std::string> SuiteRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& entry : entries_) out.push_back(entry.first);
  return out;
}

std::vector<Suite> SuiteRegistry::select(const std::string& csv) const {
  const auto all = names();
  std::vector<Suite> out;
  std::set<std::string> seen;
  std::stringstream in(csv);
  for (std::string name; std::getline(in, name, ',');) {
    auto it = std::find_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e.first == name; });
    TORCH_CHECK_VALUE(it != entries_.end(), "unknown suite '", name, "' in --suite '", csv, "'; allowed: ",
                      join(all, ", "), " (comma-separated)");
    TORCH_CHECK_VALUE(seen.insert(name).second, "suite '", name, "' listed twice in --suite '", csv, "'");
    out.push_back(it->second());
  }
  TORCH_CHECK_VALUE(!out.empty() && csv.back() != ',', "--suite '", csv, "' names no suite; allowed: ",
                    join(all, ", "), " (comma-separated)");
  return out;
}

void register_builtin_suites(SuiteRegistry& registry, const StrategyRegistry& strategies,
                             const recipes::ModelRegistry& models) {
  // Both registries by reference: the suites are built when selected, and a
  // registry without bench workloads fails then, naming the suite.
  const StrategyRegistry* s = &strategies;
  const recipes::ModelRegistry* m = &models;
  auto w = [m] { return m->bench_family().bench(); };
  for (const auto* spec : strategies.specs()) {
    registry.add(spec->name(), [s, w, spec] { return strategy_suite(*s, w(), *spec); });
  }
  registry.add("zero", [s, w] { return zero_suite(*s, w()); });
  registry.add("memory", [s, w] { return memory_suite(*s, w()); });
  registry.add("smoke", [s, w] { return smoke_suite(*s, w()); });
  registry.add("attention", [s, w] { return attention_suite(*s, w()); });
  registry.add("kernels", [s, w] { return kernels_suite(*s, w()); });
  registry.add("scale", [s, w] { return scale_suite(*s, w()); });
  registry.add("tp", [s, w] { return tp_suite(*s, w()); });
  registry.add("pp", [s, w] { return pp_suite(*s, w()); });  // bench/pp_suite.cpp
  registry.add("planner", [s, m] { return planner_suite(*s, *m); });  // bench/planner_suite.cpp
  registry.add("peer", [s, m] { return peer_suite(*s, *m); });        // bench/peer_suite.cpp
}

namespace {

/// The built-in suites over the built-in strategies and model families.
SuiteRegistry builtin_suites(StrategyRegistry& strategies, recipes::ModelRegistry& models) {
  register_builtin_strategies(strategies);
  recipes::register_builtin_models(models);
  SuiteRegistry registry;
  register_builtin_suites(registry, strategies, models);
  return registry;
}

}  // namespace

std::vector<std::string> suite_names() {
  StrategyRegistry strategies;
  recipes::ModelRegistry models;
  return builtin_suites(strategies, models).names();
}

std::vector<Suite> select_suites(const std::string& csv) {
  StrategyRegistry strategies;
  recipes::ModelRegistry models;
  return builtin_suites(strategies, models).select(csv);
}

std::vector<BenchCase> all_cases(const std::vector<Suite>& suites) {
  std::vector<BenchCase> cases;
  for (const auto& s : suites) cases.insert(cases.end(), s.cases.begin(), s.cases.end());
  return cases;
}

}  // namespace strata::bench
