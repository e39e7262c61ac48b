#include "bench/harness.h"
#include "bench/planner_suite.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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
          "CI regression gate: gpt-nano, block 64, batch 8 per rank, a few steps, 1 thread per "
          "process (gpt-nano's tiny matmuls on 2 threads slow down several-fold on a loaded "
          "machine, which would make the gate flaky). vs ref: ddp ÷ single (ideal 2.0), sdp ÷ ddp.",
          {}};
  BenchCase single = make_case("smoke", "gpt-nano", "single-1x1", "single", 1, 1);
  BenchCase ddp = make_case("smoke", "gpt-nano", "ddp-2x1", "ddp", 2, 1);
  BenchCase sdp = make_case("smoke", "gpt-nano", "sdp-2x1", "sdp", 2, 1);
  for (BenchCase* c : {&single, &ddp, &sdp}) {
    c->block_size = 64;
    c->batch_size = 8;
    c->steps = 20;
  }
  ddp.reference = single.name;
  sdp.reference = ddp.name;
  s.cases = {single, ddp, sdp};
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

std::vector<std::string> suite_names() {
  return {"single", "ddp", "zero", "fsdp", "memory", "smoke", "attention", "kernels", "planner"};
}

std::vector<Suite> select_suites(const std::string& csv) {
  const auto names = suite_names();
  std::vector<Suite> out;
  std::set<std::string> seen;
  std::stringstream in(csv);
  for (std::string name; std::getline(in, name, ',');) {
    TORCH_CHECK_VALUE(std::find(names.begin(), names.end(), name) != names.end(), "unknown suite '", name,
                      "' in --suite '", csv, "'; allowed: ", join(names, ", "), " (comma-separated)");
    TORCH_CHECK_VALUE(seen.insert(name).second, "suite '", name, "' listed twice in --suite '", csv, "'");
    if (name == "single") out.push_back(single_suite());
    if (name == "ddp") out.push_back(ddp_suite());
    if (name == "zero") out.push_back(zero_suite());
    if (name == "fsdp") out.push_back(fsdp_suite());
    if (name == "kernels") out.push_back(kernels_suite());
    if (name == "memory") out.push_back(memory_suite());
    if (name == "smoke") out.push_back(smoke_suite());
    if (name == "attention") out.push_back(attention_suite());
    if (name == "planner") out.push_back(planner_suite());
  }
  TORCH_CHECK_VALUE(!out.empty() && csv.back() != ',', "--suite '", csv, "' names no suite; allowed: ",
                    join(names, ", "), " (comma-separated)");
  return out;
}

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
  for (int repeat = 0; repeat < options.repeats; ++repeat) {
    for (const BenchCase& c : cases) {
      std::string slug = c.name;
      std::replace(slug.begin(), slug.end(), '/', '_');
      const fs::path out_dir = work / (slug + "-r" + std::to_string(repeat));
      const std::string log_path = out_dir.string() + ".log";
      const auto argv = gpt_command(c, options.gpt_binary, data_path, out_dir.string());
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
        const std::string why = rc == -1 ? "timed out after " + timeout.str() + " s (--case-timeout)"
                                : rc != 0 ? "exited with code " + std::to_string(rc)
                                          : "wrote no " + summary_path.string();
        throw CaseFailure("case " + c.name + " (repeat " + std::to_string(repeat + 1) + ") " + why + ": " +
                              run.command,
                          tail_lines(log_path, 25));
      }
      std::ifstream in(summary_path);
      run.summary = nlohmann::json::parse(in);
      const double step_s = median_step_seconds((out_dir / "metrics.csv").string());
      if (step_s > 0 && c.block_size > 0)
        run.median_step_tokens_per_s = double(c.batch_size * c.block_size * c.nproc) / step_s;
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

double median_step_seconds(const std::string& metrics_csv) {
  std::ifstream in(metrics_csv);
  std::string line;
  if (!std::getline(in, line)) return 0.0;
  auto split = [](const std::string& text) {
    std::vector<std::string> cells;
    std::stringstream cells_in(text);
    for (std::string cell; std::getline(cells_in, cell, ',');) cells.push_back(cell);
    return cells;
  };
  const auto header = split(line);
  const auto col = std::find(header.begin(), header.end(), "step_time_s") - header.begin();
  if (col == static_cast<long>(header.size())) return 0.0;
  std::vector<double> times;
  while (std::getline(in, line)) {
    const auto cells = split(line);
    // Step 1 is warm-up (allocator, thread pools), as in summary.json's tokens_per_s.
    if (static_cast<long>(cells.size()) > col && !cells[col].empty() && std::stol(cells[0]) >= 2)
      times.push_back(std::stod(cells[col]));
  }
  return times.empty() ? 0.0 : compute_stats(times).median;
}

CaseResult aggregate(const BenchCase& c, const std::vector<nlohmann::json>& summaries,
                     const std::vector<double>& median_step_tokens_per_s) {
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
  return r;
}

std::vector<CaseResult> aggregate_runs(const std::vector<BenchCase>& cases, const std::vector<CaseRun>& runs) {
  std::vector<CaseResult> results;
  for (const BenchCase& c : cases) {
    std::vector<nlohmann::json> summaries;
    std::vector<double> step_tps;
    for (const auto& run : runs) {
      if (run.bench_case->name != c.name) continue;
      summaries.push_back(run.summary);
      if (run.median_step_tokens_per_s > 0) step_tps.push_back(run.median_step_tokens_per_s);
    }
    if (!summaries.empty()) results.push_back(aggregate(c, summaries, step_tps));
  }
  return results;
}

}  // namespace strata::bench
