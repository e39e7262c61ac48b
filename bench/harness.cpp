#include "bench/harness.h"
#include "bench/planner_suite.h"

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

extern char** environ;

namespace strata::bench {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Case shapes. Batch sizes put one step at ~0.1–0.4 s on 2 idle cores, steps
// make a case ~5–20 s; block 128 on the generated text gives realistically
// shaped matmuls (the addition task's 11 tokens would not).
BenchCase make_case(const std::string& suite, const std::string& preset, const std::string& variant,
                    const std::string& strategy, int nproc, int threads) {
  BenchCase c;
  c.name = suite + "/" + preset + "/" + variant;
  c.suite = suite;
  c.preset = preset;
  c.strategy = strategy;
  c.nproc = nproc;
  c.threads_per_rank = threads;
  c.block_size = 128;
  c.steps = preset == "gpt-mini" ? 40 : 60;
  c.batch_size = preset == "gpt-mini" ? 8 : 16;
  return c;
}

Suite single_suite() {
  Suite s{"single",
          "One process, 2 threads. MFU is against the fp32 matmul peak measured by strata-gpt "
          "(issue target: gpt-mini fp32 >= 60%); bf16-mixed MFU uses the same fp32 peak, so it "
          "can exceed 100%. vs ref: bf16-mixed tokens/s ÷ fp32.",
          {}};
  for (const char* preset : {"gpt-micro", "gpt-mini"}) {
    BenchCase fp32 = make_case("single", preset, "fp32", "single", 1, 2);
    BenchCase bf16 = make_case("single", preset, "bf16-mixed", "single", 1, 2);
    bf16.precision = "bf16-mixed";
    bf16.reference = fp32.name;
    s.cases.push_back(fp32);
    s.cases.push_back(bf16);
  }
  return s;
}

Suite ddp_suite() {
  Suite s{"ddp",
          "Same global batch: single 1 rank x 2 threads at batch 2B vs ddp 2 ranks x 1 thread at "
          "batch B. vs ref: ddp ÷ single (ideal ~1.0 on 2 cores); per-grad-after-bw (one "
          "all-reduce per gradient after backward: --bucket-cap-mb 0 --overlap-comm false) ÷ ddp "
          "shows what bucketing plus overlap buy; 1mib (bucketed, several buckets) ÷ ddp, and "
          "1mib-after-bw ÷ 1mib isolates the overlap (at 25 MiB these models fit one bucket, which "
          "can only start when backward ends).",
          {}};
  for (const char* preset : {"gpt-micro", "gpt-mini"}) {
    BenchCase single = make_case("ddp", preset, "single-1x2", "single", 1, 2);
    BenchCase ddp = make_case("ddp", preset, "ddp-2x1", "ddp", 2, 1);
    ddp.batch_size = single.batch_size / 2;
    ddp.reference = single.name;
    auto variant = [&ddp](const std::string& suffix, std::vector<std::string> flags,
                          const std::string& reference) {
      BenchCase c = ddp;
      c.name += "-" + suffix;
      c.extra = std::move(flags);
      c.reference = reference;
      return c;
    };
    BenchCase per_grad = variant("per-grad-after-bw", {"--bucket-cap-mb", "0", "--overlap-comm", "false"}, ddp.name);
    BenchCase small = variant("1mib", {"--bucket-cap-mb", "1"}, ddp.name);
    BenchCase small_after = variant("1mib-after-bw", {"--bucket-cap-mb", "1", "--overlap-comm", "false"}, small.name);
    s.cases.insert(s.cases.end(), {single, ddp, per_grad, small, small_after});
  }
  return s;
}

Suite zero_suite() {
  Suite s{"zero",
          "gpt-mini, 2 ranks x 1 thread. state/formula: measured model-state bytes per rank ÷ the "
          "ZeRO formula (fp32 AdamW: ddp 16Ψ', oss 8Ψ'+8Ψ'/N, sdp 4Ψ'+12Ψ'/N); expect 1.00 "
          "within 5% plus bucket buffers. vs ref: ÷ ddp.",
          {}};
  BenchCase ddp = make_case("zero", "gpt-mini", "ddp-2x1", "ddp", 2, 1);
  s.cases.push_back(ddp);
  for (const char* strategy : {"oss", "sdp"}) {
    BenchCase c = make_case("zero", "gpt-mini", std::string(strategy) + "-2x1", strategy, 2, 1);
    c.reference = ddp.name;
    s.cases.push_back(c);
  }
  return s;
}

Suite memory_suite() {
  Suite s{"memory",
          "gpt-mini, N ranks x 1 thread, batch 8 per rank, a few steps: memory is exact, tokens/s "
          "are incidental (N=4 puts 4 ranks on 2 cores). peak vs ref: peak tensor bytes per rank "
          "÷ the same strategy at N=1.",
          {}};
  for (const char* strategy : {"oss", "sdp"}) {
    std::string n1;
    for (int n : {1, 2, 4}) {
      BenchCase c = make_case("memory", "gpt-mini", std::string(strategy) + "-n" + std::to_string(n), strategy, n, 1);
      c.steps = 8;
      c.reference = n1;
      if (n == 1) n1 = c.name;
      s.cases.push_back(c);
    }
  }
  return s;
}

Suite fsdp_suite() {
  Suite s{"fsdp",
          "gpt-mini, 2 ranks x 1 thread, the same global batch: ddp (the reference), oss, sdp, fsdp, "
          "and fsdp with activation checkpointing of every block (ac), --precision bf16-mixed (units "
          "all-gathered in bf16, fp32 shards and reduce-scatter), and --offload disk (shards, grads "
          "and AdamW state in an unnamed file in the case's output directory, the step streamed "
          "through 8 MiB of staging). comm/step is rank 0's bytes sent (ddp ~2Ψ, fsdp ~3Ψ, fsdp "
          "bf16 ~2Ψ, Ψ = fp32 parameter bytes); the model state of offloaded fsdp is what stays "
          "in memory. vs ref: ÷ ddp.",
          {}};
  BenchCase ddp = make_case("fsdp", "gpt-mini", "ddp-2x1", "ddp", 2, 1);
  s.cases.push_back(ddp);
  auto add = [&](const std::string& variant, const std::string& strategy, std::vector<std::string> extra,
                 const std::string& precision = "32") {
    BenchCase c = make_case("fsdp", "gpt-mini", variant, strategy, 2, 1);
    c.extra = std::move(extra);
    c.precision = precision;
    c.reference = ddp.name;
    s.cases.push_back(c);
  };
  add("oss-2x1", "oss", {});
  add("sdp-2x1", "sdp", {});
  add("fsdp-2x1", "fsdp", {});
  add("fsdp-ac-2x1", "fsdp", {"--activation-checkpointing", "1"});
  add("fsdp-bf16-2x1", "fsdp", {}, "bf16-mixed");
  add("fsdp-offload-disk-2x1", "fsdp", {"--offload", "disk"});
  return s;
}

Suite smoke_suite() {
  Suite s{"smoke",
          "CI regression gate: every strategy at 2 ranks on gpt-nano (fsdp also with activation "
          "checkpointing and with --offload disk), single as one process; block 64, batch 8 per "
          "rank, a few steps, 1 thread per process (gpt-nano's tiny matmuls on 2 threads slow down "
          "several-fold on a loaded machine, which would make the gate flaky). vs ref: ddp ÷ single "
          "(ideal 2.0), the others ÷ ddp.",
          {}};
  auto add = [&s](const std::string& variant, const std::string& strategy, int nproc,
                  std::vector<std::string> extra, const std::string& reference) {
    BenchCase c = make_case("smoke", "gpt-nano", variant, strategy, nproc, 1);
    c.block_size = 64;
    c.batch_size = 8;
    c.steps = 20;
    c.extra = std::move(extra);
    c.reference = reference;
    s.cases.push_back(c);
    return c.name;
  };
  const std::string single = add("single-1x1", "single", 1, {}, "");
  const std::string ddp = add("ddp-2x1", "ddp", 2, {}, single);
  add("oss-2x1", "oss", 2, {}, ddp);
  add("sdp-2x1", "sdp", 2, {}, ddp);
  add("fsdp-2x1", "fsdp", 2, {}, ddp);
  add("fsdp-ac-2x1", "fsdp", 2, {"--activation-checkpointing", "1"}, ddp);
  add("fsdp-offload-disk-2x1", "fsdp", 2, {"--offload", "disk"}, ddp);
  return s;
}

Suite scale_suite() {
  Suite s{"scale",
          "Slow, not in CI. The largest preset each strategy fits, per world size: every preset "
          "from gpt-nano to gpt2-medium under ddp, oss, sdp, fsdp and fsdp --offload disk at N = 1, 2 and 4 "
          "ranks x 1 thread, batch 1 per rank, block 128, 3 steps. A case that runs out of memory "
          "(or time) is recorded as failed and the sweep goes on; the largest preset that ran per "
          "strategy and N is listed under the table. peak vs ref: ÷ the same preset under ddp.",
          {}};
  for (int n : {1, 2, 4}) {
    // gpt2-large/xl (774M/1.5B parameters: 12/24 GB of fp32 AdamW state per
    // unsharded rank) are left out: on a shared machine an OOM there hurts others.
    for (const char* preset : {"gpt-nano", "gpt-micro", "gpt-mini", "gpt2", "gpt2-medium"}) {
      std::string ddp;
      for (const std::string variant : {"ddp", "oss", "sdp", "fsdp", "fsdp-offload-disk"}) {
        const std::string strategy = variant.substr(0, variant.find('-'));
        BenchCase c = make_case("scale", preset, variant + "-n" + std::to_string(n), strategy, n, 1);
        c.batch_size = 1;
        c.steps = 3;
        if (variant == "fsdp-offload-disk") c.extra = {"--offload", "disk"};
        c.reference = ddp;
        if (variant == "ddp") ddp = c.name;
        s.cases.push_back(c);
      }
    }
  }
  return s;
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : sep) + item;
  return out;
}

std::string shell_quote(const std::string& arg) {
  if (!arg.empty() && arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+") ==
                          std::string::npos)
    return arg;
  std::string out = "'";
  for (char ch : arg) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::string tail_lines(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::deque<std::string> tail;
  for (std::string line; std::getline(in, line);) {
    tail.push_back(line);
    if (tail.size() > lines) tail.pop_front();
  }
  std::string out;
  for (const auto& line : tail) out += line + "\n";
  return out;
}

/// Spawns argv with stdout+stderr to `log_path`; returns the exit code (128+sig
/// when signalled), or -1 after killing it at `timeout_s`.
int run_process(const std::vector<std::string>& argv, const std::string& log_path, double timeout_s) {
  // Why filter the environment: strata-gpt joins an existing world when it sees
  // torchrun/SLURM/Open MPI variables (e.g. strata-bench inside an sbatch job);
  // every case must start its own world instead.
  const std::set<std::string> world_vars = {"RANK",         "WORLD_SIZE",   "LOCAL_RANK",   "LOCAL_WORLD_SIZE",
                                            "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"};
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    const std::string key = entry.substr(0, entry.find('='));
    if (world_vars.count(key) || key.rfind("OMPI_COMM_WORLD_", 0) == 0) continue;
    env_strings.push_back(entry);
  }
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = 0;
  const int err = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  TORCH_CHECK(err == 0, "cannot start ", argv[0], ": ", std::strerror(err));

  // Polled rather than a blocking waitpid so a hung run (a deadlocked
  // collective) cannot hang the harness. SIGTERM lets strata-gpt's launcher
  // stop its ranks; SIGKILL follows if it does not exit.
  const auto start = Clock::now();
  bool timed_out = false;
  int status = 0;
  while (true) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (!timed_out && elapsed > timeout_s) {
      timed_out = true;
      ::kill(pid, SIGTERM);
    } else if (timed_out && elapsed > timeout_s + 10) {
      ::kill(pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (timed_out) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int64_t max_over_ranks(const nlohmann::json& per_rank, const std::function<int64_t(const nlohmann::json&)>& value) {
  int64_t best = 0;
  for (const auto& item : per_rank) best = std::max(best, value(item));
  return best;
}

Suite attention_suite() {
  Suite s{"attention",
          "gpt-mini, one process x 2 threads, --attention naive vs fused (kernels/attention.h) at "
          "block 256 and 1024, fp32 and bf16-mixed. vs ref: fused ÷ naive at the same block size "
          "and precision (tokens/s; peak: tensor bytes).",
          {}};
  for (int64_t block : {256, 1024}) {
    for (const char* precision : {"32", "bf16-mixed"}) {
      const std::string tag = std::string(precision == std::string("32") ? "fp32" : "bf16") + "-t" +
                              std::to_string(block);
      BenchCase naive = make_case("attention", "gpt-mini", "naive-" + tag, "single", 1, 2);
      BenchCase fused = make_case("attention", "gpt-mini", "fused-" + tag, "single", 1, 2);
      for (BenchCase* c : {&naive, &fused}) {
        c->precision = precision;
        c->block_size = block;
        c->batch_size = block == 256 ? 8 : 2;  // the same tokens per step
        c->steps = 20;
      }
      naive.extra = {"--attention", "naive"};
      fused.extra = {"--attention", "fused"};
      fused.reference = naive.name;
      s.cases.push_back(naive);
      s.cases.push_back(fused);
    }
  }
  return s;
}

Suite kernels_suite() {
  Suite s{"kernels",
          "Both fused kernels (--attention fused, --fused-adamw true: the defaults) against both "
          "off (--attention naive --fused-adamw false), block 256, batch 8 per rank: gpt-mini as "
          "one process x 2 threads and as ddp 2 ranks x 1 thread, and a 384-wide gpt-mini "
          "(--n-embd 384) as one process. vs ref: fused ÷ unfused.",
          {}};
  auto pair = [&](const std::string& tag, const std::string& strategy, int nproc, int threads,
                  std::vector<std::string> model) {
    BenchCase off = make_case("kernels", "gpt-mini", "unfused-" + tag, strategy, nproc, threads);
    BenchCase on = make_case("kernels", "gpt-mini", "fused-" + tag, strategy, nproc, threads);
    for (BenchCase* c : {&off, &on}) {
      c->block_size = 256;
      c->batch_size = 8;
      c->steps = 20;
      c->extra = model;
    }
    off.extra.insert(off.extra.end(), {"--attention", "naive", "--fused-adamw", "false"});
    on.reference = off.name;
    s.cases.push_back(off);
    s.cases.push_back(on);
  };
  pair("single-1x2", "single", 1, 2, {});
  pair("ddp-2x1", "ddp", 2, 1, {});
  pair("384-single-1x2", "single", 1, 2, {"--n-embd", "384"});
  return s;
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

void register_builtin_suites(SuiteRegistry& registry) {
  registry.add("single", single_suite);
  registry.add("ddp", ddp_suite);
  registry.add("zero", zero_suite);
  registry.add("fsdp", fsdp_suite);
  registry.add("memory", memory_suite);
  registry.add("smoke", smoke_suite);
  registry.add("attention", attention_suite);
  registry.add("kernels", kernels_suite);
  registry.add("scale", scale_suite);
  registry.add("planner", planner_suite);  // bench/planner_suite.cpp
}

std::vector<std::string> suite_names() {
  SuiteRegistry registry;
  register_builtin_suites(registry);
  return registry.names();
}

std::vector<Suite> select_suites(const std::string& csv) {
  SuiteRegistry registry;
  register_builtin_suites(registry);
  return registry.select(csv);
}

std::string libtorch_version() { return TORCH_VERSION; }

std::vector<BenchCase> all_cases(const std::vector<Suite>& suites) {
  std::vector<BenchCase> cases;
  for (const auto& s : suites) cases.insert(cases.end(), s.cases.begin(), s.cases.end());
  return cases;
}

std::vector<std::string> gpt_command(const BenchCase& c, const std::string& gpt_binary, const std::string& data_path,
                                     const std::string& output_dir) {
  std::vector<std::string> cmd = {gpt_binary,
                                  "--preset", c.preset,
                                  "--strategy", c.strategy,
                                  "--nproc", std::to_string(c.nproc),
                                  "--threads-per-rank", std::to_string(c.threads_per_rank),
                                  "--precision", c.precision,
                                  "--device", c.device,
                                  "--data", c.data == kGeneratedText ? data_path : c.data,
                                  "--batch-size", std::to_string(c.batch_size),
                                  "--max-steps", std::to_string(c.steps),
                                  "--limit-val-batches", "0",
                                  "--progress-bar", "false",
                                  // Every step in metrics.csv, for the median step time.
                                  "--log-every-n-steps", "1",
                                  "--output-dir", output_dir};
  if (c.block_size > 0) cmd.insert(cmd.end(), {"--block-size", std::to_string(c.block_size)});
  cmd.insert(cmd.end(), c.extra.begin(), c.extra.end());
  return cmd;
}

void write_generated_text(const std::string& path, int64_t bytes) {
  // mt19937's output sequence is fixed by the standard (distributions are not),
  // so the file is identical everywhere.
  std::mt19937 gen(20240601);
  std::string text(static_cast<size_t>(bytes), ' ');
  for (auto& ch : text) ch = static_cast<char>(32 + gen() % 95);
  std::ofstream out(path, std::ios::binary);
  out << text;
  TORCH_CHECK(out.good(), "cannot write the generated text file ", path);
}

double zero_model_state_bytes(const std::string& strategy, int64_t parameters, int world_size) {
  TORCH_CHECK_VALUE(parameters >= 0 && world_size >= 1, "zero_model_state_bytes: need parameters >= 0 and ",
                    "world_size >= 1, got ", parameters, " and ", world_size);
  const double p = static_cast<double>(parameters), n = world_size;
  if (strategy == "single" || strategy == "ddp") return 16 * p;
  if (strategy == "oss") return 8 * p + 8 * p / n;
  if (strategy == "sdp") return 4 * p + 12 * p / n;
  if (strategy == "fsdp") return 16 * p / n;
  TORCH_CHECK_VALUE(false, "no ZeRO formula for strategy '", strategy, "'; known: single, ddp, oss, sdp, fsdp");
}

Stats compute_stats(std::vector<double> values) {
  TORCH_CHECK_VALUE(!values.empty(), "compute_stats: no values");
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return {n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2, values.front(), values.back()};
}

nlohmann::json MachineInfo::to_json() const {
  return {{"uname", uname}, {"cpu_model", cpu_model}, {"nproc", nproc}, {"load_average", load_average}};
}

MachineInfo machine_info() {
  MachineInfo info;
  struct utsname u {};
  if (::uname(&u) == 0) info.uname = std::string(u.sysname) + " " + u.release + " " + u.machine;
  info.nproc = static_cast<int>(std::thread::hardware_concurrency());
  std::ifstream("/proc/loadavg") >> info.load_average;
  info.cpu_model = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      info.cpu_model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return info;
}

std::string git_commit(const std::string& source_dir) {
  auto capture = [](const std::string& cmd, std::string* out) {
    FILE* pipe = ::popen(cmd.c_str(), "r");
    if (!pipe) return -1;
    char buf[128];
    while (std::fgets(buf, sizeof(buf), pipe)) *out += buf;
    return ::pclose(pipe);
  };
  const std::string git = "git -C " + shell_quote(source_dir);
  std::string out, ignored;
  if (capture(git + " rev-parse --short HEAD 2>/dev/null", &out) != 0) return "unknown";
  while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back()))) out.pop_back();
  if (out.empty()) return "unknown";
  // Numbers from uncommitted changes must not be credited to the commit.
  if (capture(git + " diff --quiet HEAD -- 2>/dev/null", &ignored) != 0) out += "-dirty";
  return out;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::vector<CaseRun> run_interleaved(const std::vector<BenchCase>& cases, const RunOptions& options) {
  TORCH_CHECK_VALUE(options.repeats >= 1, "--repeats must be >= 1, got ", options.repeats);
  const fs::path work(options.work_dir);
  const std::string data_path = (work / "generated.txt").string();
  if (!fs::exists(data_path)) write_generated_text(data_path);

  std::vector<CaseRun> runs;
  std::set<std::string> failed;  // a case that crashed once is not run again
  for (int repeat = 0; repeat < options.repeats; ++repeat) {
    for (const BenchCase& c : cases) {
      if (!c.skip_reason.empty() || failed.count(c.name)) continue;
      std::string slug = c.name;
      std::replace(slug.begin(), slug.end(), '/', '_');
      const fs::path out_dir = work / (slug + "-r" + std::to_string(repeat));
      const std::string log_path = out_dir.string() + ".log";
      auto argv = gpt_command(c, options.gpt_binary, data_path, out_dir.string());
      if (!options.inject_regression.empty() && options.inject_regression == c.name)
        argv.push_back("--debug-extra-param-copy");
      std::vector<std::string> quoted;
      for (const auto& a : argv) quoted.push_back(shell_quote(a));

      CaseRun run;
      run.bench_case = &c;
      run.repeat = repeat;
      run.command = join(quoted, " ");
      const auto start = Clock::now();
      const int rc = run_process(argv, log_path, options.case_timeout_s);
      run.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
      const fs::path summary_path = out_dir / "summary.json";
      if (rc != 0 || !fs::exists(summary_path)) {
        std::ostringstream timeout;
        timeout << options.case_timeout_s;
        // 137 = 128 + SIGKILL: on Linux most often the kernel's OOM killer.
        run.error = rc == -1    ? "timed out after " + timeout.str() + " s (--case-timeout)"
                    : rc == 137 ? "killed by SIGKILL (exit 137; out of memory?)"
                    : rc != 0   ? "exited with code " + std::to_string(rc)
                                : "wrote no " + summary_path.string();
        run.output_tail = tail_lines(log_path, 25);
        failed.insert(c.name);
      } else {
        try {
          std::ifstream in(summary_path);
          run.summary = nlohmann::json::parse(in);
        } catch (const nlohmann::json::exception& e) {
          run.error = "unreadable " + summary_path.string() + ": " + e.what();
          failed.insert(c.name);
        }
        const std::string csv = (out_dir / "metrics.csv").string();
        const double tokens_per_step = double(c.batch_size * c.block_size * c.nproc);
        const double step_s = median_step_seconds(csv), best_s = min_step_seconds(csv);
        if (step_s > 0 && c.block_size > 0) run.median_step_tokens_per_s = tokens_per_step / step_s;
        if (best_s > 0 && c.block_size > 0) run.best_step_tokens_per_s = tokens_per_step / best_s;
      }
      runs.push_back(std::move(run));
      if (options.on_run) options.on_run(runs.back());
    }
  }
  return runs;
}

int64_t peak_tensor_bytes_max(const nlohmann::json& summary) {
  return max_over_ranks(summary.at("peak_tensor_bytes"), [](const nlohmann::json& v) { return v.get<int64_t>(); });
}

int64_t peak_rss_bytes_max(const nlohmann::json& summary) {
  if (!summary.contains("peak_rss_bytes")) return 0;
  return max_over_ranks(summary.at("peak_rss_bytes"), [](const nlohmann::json& v) { return v.get<int64_t>(); });
}

int64_t model_state_bytes_max(const nlohmann::json& summary) {
  return max_over_ranks(summary.at("model_state_bytes"), [](const nlohmann::json& m) {
    return m.at("params").get<int64_t>() + m.at("grads").get<int64_t>() + m.at("optimizer").get<int64_t>();
  });
}

namespace {

/// step_time_s of steps >= 2 in a strata-gpt metrics.csv (empty if unreadable).
std::vector<double> step_seconds(const std::string& metrics_csv) {
  std::ifstream in(metrics_csv);
  std::string line;
  if (!std::getline(in, line)) return {};
  auto split = [](const std::string& text) {
    std::vector<std::string> cells;
    std::stringstream cells_in(text);
    for (std::string cell; std::getline(cells_in, cell, ',');) cells.push_back(cell);
    return cells;
  };
  const auto header = split(line);
  const auto col = std::find(header.begin(), header.end(), "step_time_s") - header.begin();
  if (col == static_cast<long>(header.size())) return {};
  std::vector<double> times;
  while (std::getline(in, line)) {
    const auto cells = split(line);
    // Step 1 is warm-up (allocator, thread pools), as in summary.json's tokens_per_s.
    if (static_cast<long>(cells.size()) > col && !cells[col].empty() && std::stol(cells[0]) >= 2)
      times.push_back(std::stod(cells[col]));
  }
  return times;
}

}  // namespace

double median_step_seconds(const std::string& metrics_csv) {
  const auto times = step_seconds(metrics_csv);
  return times.empty() ? 0.0 : compute_stats(times).median;
}

double min_step_seconds(const std::string& metrics_csv) {
  const auto times = step_seconds(metrics_csv);
  return times.empty() ? 0.0 : compute_stats(times).min;
}

namespace {

std::optional<double> median_of(const std::vector<double>& values) {
  if (values.empty()) return std::nullopt;
  return compute_stats(values).median;
}

std::optional<int64_t> max_of(const std::vector<int64_t>& values) {
  if (values.empty()) return std::nullopt;
  return *std::max_element(values.begin(), values.end());
}

/// Per-rank numbers over runs: summary.json's "per_rank" array when present,
/// else what the older per-rank arrays (peak_tensor_bytes, model_state_bytes,
/// peak_rss_bytes) and rank 0's scalars give.
std::vector<RankResult> aggregate_ranks(const std::vector<nlohmann::json>& summaries, int world_size) {
  struct Samples {
    std::vector<double> tps, forward, backward, comm_wait, optimizer, step;
    std::vector<int64_t> peak, rss, params, grads, opt, other, pparams, pgrads, popt;
    std::map<std::string, double> comm;
  };
  std::vector<Samples> samples(static_cast<size_t>(std::max(world_size, 1)));
  auto put_d = [](std::vector<double>& v, const nlohmann::json& j, const char* key) {
    if (j.contains(key) && j.at(key).is_number()) v.push_back(j.at(key).get<double>());
  };
  auto put_i = [](std::vector<int64_t>& v, const nlohmann::json& j, const char* key) {
    if (j.contains(key) && j.at(key).is_number()) v.push_back(j.at(key).get<int64_t>());
  };
  for (const auto& s : summaries) {
    if (s.contains("per_rank") && s.at("per_rank").is_array()) {
      for (const auto& pr : s.at("per_rank")) {
        const size_t r = pr.value("rank", 0);
        if (r >= samples.size()) samples.resize(r + 1);
        Samples& x = samples[r];
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
      continue;
    }
    // Older summaries: per-rank memory arrays, rank 0's times and bytes.
    for (size_t r = 0; r < samples.size(); ++r) {
      Samples& x = samples[r];
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
    Samples& zero = samples[0];
    put_d(zero.backward, s, "backward_s_per_step");
    put_d(zero.comm_wait, s, "grad_sync_s_per_step");
    const int64_t steps = s.value("steps", int64_t{0});
    if (zero.comm.empty() && steps > 0 && s.contains("comm_bytes_rank0"))
      for (const auto& item : s.at("comm_bytes_rank0").items())
        zero.comm[item.key()] = item.value().get<double>() / double(steps);
  }
  std::vector<RankResult> out;
  for (size_t r = 0; r < samples.size(); ++r) {
    const Samples& x = samples[r];
    RankResult rr;
    rr.rank = static_cast<int>(r);
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
    out.push_back(rr);
  }
  return out;
}

}  // namespace

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
  std::vector<double> tps, mfu, peak_flops, backward, grad_sync;
  for (const auto& s : summaries) {
    tps.push_back(s.at("tokens_per_s").get<double>());
    backward.push_back(s.value("backward_s_per_step", 0.0));
    grad_sync.push_back(s.value("grad_sync_s_per_step", 0.0));
    mfu.push_back(s.value("mfu", 0.0));
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
  // Without the planner's prediction: the ZeRO formula's split, where it
  // applies (fp32 AdamW, nothing offloaded).
  const bool offloaded = std::find(c.extra.begin(), c.extra.end(), "--offload") != c.extra.end();
  if ((c.precision == "32" || c.precision == "fp32") && !offloaded) {
    const double p = double(r.parameters), n = double(r.world_size);
    std::optional<std::array<double, 3>> split;  // params, grads, optimizer bytes
    if (c.strategy == "single" || c.strategy == "ddp") split = {{4 * p, 4 * p, 8 * p}};
    if (c.strategy == "oss") split = {{4 * p, 4 * p, 8 * p / n}};
    if (c.strategy == "sdp") split = {{4 * p, 4 * p / n, 8 * p / n}};
    if (c.strategy == "fsdp") split = {{4 * p / n, 4 * p / n, 8 * p / n}};
    for (RankResult& k : r.ranks) {
      if (!split || k.predicted_params) continue;
      k.predicted_params = static_cast<int64_t>((*split)[0]);
      k.predicted_grads = static_cast<int64_t>((*split)[1]);
      k.predicted_optimizer = static_cast<int64_t>((*split)[2]);
    }
  }
  std::vector<double> psi, ratio, peak;
  for (const auto& s : summaries) {
    if (s.contains("psi") && s.at("psi").is_number()) psi.push_back(s.at("psi").get<double>());
    if (s.contains("comm_ratio_to_psi") && s.at("comm_ratio_to_psi").is_number())
      ratio.push_back(s.at("comm_ratio_to_psi").get<double>());
    if (s.contains("matmul_peak_flops") && s.at("matmul_peak_flops").is_number())
      peak.push_back(s.at("matmul_peak_flops").get<double>());
  }
  r.psi = median_of(psi);
  r.comm_ratio_to_psi = median_of(ratio);
  r.matmul_peak_flops = median_of(peak);
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
    for (const auto& run : runs) {
      if (run.bench_case->name != c.name) continue;
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
    results.push_back(r);
  }
  return results;
}

}  // namespace strata::bench
