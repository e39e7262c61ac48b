#include "strata/bench/sweep.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <charconv>
#include <set>
#include <sstream>

namespace strata::bench {

std::vector<std::string> sweep_precisions() { return {"fp32", "bf16-mixed"}; }

std::vector<std::string> split_list(const std::string& csv, const std::string& what) {
  std::vector<std::string> out;
  std::stringstream in(csv);
  for (std::string item; std::getline(in, item, ',');) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    TORCH_CHECK_VALUE(!item.empty(), "--", what, " '", csv, "' has an empty item; expected a comma-separated list");
    out.push_back(item);
  }
  TORCH_CHECK_VALUE(!out.empty() && csv.back() != ',', "--", what, " '", csv,
                    "' has an empty item; expected a comma-separated list");
  return out;
}

std::vector<int64_t> split_int_list(const std::string& csv, const std::string& what) {
  std::vector<int64_t> out;
  for (const auto& item : split_list(csv, what)) {
    int64_t v = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    TORCH_CHECK_VALUE(ec == std::errc() && end == item.data() + item.size(), "--", what, " item '", item, "' in '",
                      csv, "' is not an integer");
    out.push_back(v);
  }
  return out;
}

namespace {

template <typename T>
void check_axis(const std::vector<T>& values, const std::string& what, const std::vector<std::string>& allowed = {}) {
  TORCH_CHECK_VALUE(!values.empty(), "sweep axis --", what, " is empty");
  std::set<T> seen;
  for (const auto& v : values) {
    TORCH_CHECK_VALUE(seen.insert(v).second, "sweep axis --", what, " lists '", v, "' twice");
    if constexpr (std::is_same_v<T, std::string>) {
      TORCH_CHECK_VALUE(allowed.empty() || std::find(allowed.begin(), allowed.end(), v) != allowed.end(),
                        "unknown value '", v, "' for sweep axis --", what, "; allowed: ", c10::Join(", ", allowed));
    }
  }
}

/// Cases [first, end) of `s` (one preset, world size and shape) divide by
/// the reference strategy's plain fp32 case (its micro-batches the first
/// given), else by the group's first runnable case.
void set_group_reference(Suite& s, size_t first, const StrategyRegistry& strategies, const std::string& reference) {
  const auto plain = [](const BenchCase& c) {
    return c.extra.empty() || (c.extra.size() == 2 && c.extra[0] == "--accumulate-grad-batches");
  };
  std::string group_ref;
  for (size_t i = first; i < s.cases.size() && group_ref.empty(); ++i) {
    const BenchCase& c = s.cases[i];
    if (c.skip_reason.empty() && !reference.empty() && strategies.resolve(c.strategy) == reference && plain(c) &&
        c.precision == "fp32")
      group_ref = c.name;
  }
  for (size_t i = first; i < s.cases.size() && group_ref.empty(); ++i)
    if (s.cases[i].skip_reason.empty()) group_ref = s.cases[i].name;
  for (size_t i = first; i < s.cases.size(); ++i)
    if (s.cases[i].name != group_ref && s.cases[i].skip_reason.empty()) s.cases[i].reference = group_ref;
}

}  // namespace

void validate(const SweepOptions& o, const StrategyRegistry& strategies, const recipes::ModelRegistry& models) {
  if (!o.presets().empty()) check_axis(o.presets(), "presets", models.preset_names());
  if (!o.strategies().empty()) check_axis(o.strategies(), "strategies", strategies.names());
  check_axis(o.precision(), "precision", sweep_precisions());
  check_axis(o.offload(), "offload", {"none", "cpu", "disk"});
  check_axis(o.ac(), "ac");
  check_axis(o.nproc(), "nproc");
  check_axis(o.batch_size(), "batch-size");
  check_axis(o.block_size(), "block-size");
  check_axis(o.pp(), "pp");
  check_axis(o.microbatches(), "microbatches");
  for (auto v : o.pp()) TORCH_CHECK_VALUE(v >= 1, "sweep axis --pp value ", v, " must be >= 1 (1: no pipeline)");
  for (auto v : o.microbatches()) TORCH_CHECK_VALUE(v >= 1, "sweep axis --microbatches value ", v, " must be >= 1");
  for (auto v : o.ac()) TORCH_CHECK_VALUE(v >= 0, "sweep axis --ac value ", v, " must be >= 0 (0 off, n every n-th block)");
  for (auto v : o.nproc()) TORCH_CHECK_VALUE(v >= 1, "sweep axis --nproc value ", v, " must be >= 1");
  for (auto v : o.batch_size()) TORCH_CHECK_VALUE(v >= 1, "sweep axis --batch-size value ", v, " must be >= 1");
  for (auto v : o.block_size()) TORCH_CHECK_VALUE(v >= 1, "sweep axis --block-size value ", v, " must be >= 1");
  TORCH_CHECK_VALUE(o.steps() >= 2, "--steps must be >= 2 (the first step is warm-up), got ", o.steps());
  TORCH_CHECK_VALUE(o.threads_per_rank() >= 1, "--threads-per-rank must be >= 1, got ", o.threads_per_rank());
  TORCH_CHECK_VALUE(o.device() == "cpu" || o.device() == "cuda", "--device must be cpu or cuda, got '", o.device(),
                    "'");
}

Suite make_sweep(const SweepOptions& o, const StrategyRegistry& strategies, const recipes::ModelRegistry& models) {
  validate(o, strategies, models);
  const std::vector<std::string> presets =
      o.presets().empty() ? std::vector<std::string>{models.default_preset()} : o.presets();
  const std::string reference = strategies.reference() ? strategies.reference()->name() : "";
  std::vector<std::string> names = o.strategies();
  if (names.empty()) {
    TORCH_CHECK_VALUE(!reference.empty(), "sweep axis --strategies is empty and no strategy is the reference");
    names = {reference};
  }
  Suite s{"sweep",
          "Sweep: every combination of the axes given, same generated data and seed; vs ref: ÷ the "
          "fp32 " + reference + " case of the same preset, world size and shape. Skipped rows are combinations "
          "strata-gpt refuses.",
          {}};
  for (const auto& preset : presets)
    for (int n : o.nproc())
      for (int64_t batch : o.batch_size())
        for (int64_t block : o.block_size()) {
          const size_t group_start = s.cases.size();
          for (const auto& strategy : names)
            for (int64_t ac : o.ac())
              for (const auto& offload : o.offload())
                for (const auto& precision : o.precision())
                  for (int pp : o.pp())
                    for (int64_t m : o.microbatches()) {
                  BenchCase c;
                  std::string variant = strategy;
                  if (ac > 0) variant += "-ac" + std::to_string(ac);
                  if (offload != "none") variant += "-offload-" + offload;
                  if (precision != "fp32") variant += "-bf16";
                  if (pp > 1) variant += "-pp" + std::to_string(pp);
                  if (m > 1) variant += "-m" + std::to_string(m);
                  variant += "-" + std::to_string(n) + "x" + std::to_string(o.threads_per_rank()) + "-b" +
                             std::to_string(batch) + "-t" + std::to_string(block);
                  c.name = "sweep/" + preset + "/" + variant;
                  c.suite = "sweep";
                  c.preset = preset;
                  c.strategy = strategy;
                  c.nproc = n;
                  c.threads_per_rank = o.threads_per_rank();
                  c.precision = precision;
                  c.steps = o.steps();
                  c.batch_size = batch;
                  c.block_size = block;
                  c.device = o.device();
                  if (ac > 0) c.extra = {"--activation-checkpointing", std::to_string(ac)};
                  if (offload != "none") c.extra.insert(c.extra.end(), {"--offload", offload});
                  if (m > 1) c.extra.insert(c.extra.end(), {"--accumulate-grad-batches", std::to_string(m)});
                  if (pp > 1) c.extra.insert(c.extra.end(), {"--pp-size", std::to_string(pp), "--pp-schedule", o.pp_schedule()});
                  // What strata-gpt would refuse (exit 2), kept as skipped rows.
                  const int most = strategies.spec(strategy).max_world_size();
                  if (n % pp != 0)
                    c.skip_reason = "--pp-size " + std::to_string(pp) + " does not divide --nproc " + std::to_string(n);
                  else if (most > 0 && n / pp > most)
                    c.skip_reason = "strategy " + strategy + " runs at most " + std::to_string(most) +
                                    " process(es) (--nproc " + std::to_string(n) +
                                    (pp > 1 ? " over " + std::to_string(pp) + " stages" : std::string()) + ")";
                  else if (offload == "cpu" && o.device() != "cuda")
                    c.skip_reason = "--offload cpu (pinned host memory) needs a CUDA device";
                  s.cases.push_back(c);
                }
          set_group_reference(s, group_start, strategies, reference);
        }
  return s;
}

}  // namespace strata::bench
