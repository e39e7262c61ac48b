// Running cases: strata-gpt's command line for a case, one subprocess per
// run (with a timeout), the runs interleaved over repeats, and what a report
// says about the machine and the build.
#include "strata/bench/harness.h"

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

extern char** environ;

namespace strata::bench {
namespace fs = std::filesystem;

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : sep) + item;
  return out;
}

using Clock = std::chrono::steady_clock;

namespace {

/// A positive integer flag among a case's flags (1 when absent).
int64_t flag_of(const BenchCase& c, const std::string& flag) {
  for (size_t i = 0; i + 1 < c.extra.size(); ++i) {
    if (c.extra[i] == flag) return std::max<int64_t>(1, std::atoll(c.extra[i + 1].c_str()));
  }
  return 1;
}

/// Tokens one optimizer step trains: samples are per data-parallel rank
/// and micro-batch (the ranks of a tensor-parallel group and of a pipeline
/// read the same ones).
double tokens_per_step(const BenchCase& c) {
  const int64_t data_ranks = std::max<int64_t>(1, c.nproc / (flag_of(c, "--tp-size") * flag_of(c, "--pp-size")));
  return double(c.batch_size * c.block_size * flag_of(c, "--accumulate-grad-batches") * data_ranks);
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

/// Bytes the loopback interface has transmitted since boot (/proc/net/dev),
/// -1 when unreadable. Ranks on one machine talk over it (Gloo's TCP pairs,
/// the store), whichever program runs them.
int64_t loopback_tx_bytes() {
  std::ifstream in("/proc/net/dev");
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != "lo") continue;
    std::istringstream fields(line.substr(colon + 1));
    int64_t value = -1;
    for (int i = 0; i < 9; ++i) fields >> value;  // 8 receive fields, then transmit bytes
    return fields ? value : -1;
  }
  return -1;
}

/// The initial weights of `c`'s model shape, drawn once by the peer script
/// (--write-init) into the work dir and reused by every case of that shape.
std::string shared_init_file(const BenchCase& c, const RunOptions& options, const fs::path& work) {
  const auto flags = model_shape_flags(c);
  std::string slug = "init";
  for (const auto& f : flags) slug += f.rfind("--", 0) == 0 ? "_" + f.substr(2) : "-" + f;  // init_preset-gpt-mini_...
  // A transformers directory (gpt_peer.py writes one for a Llama preset) or a torch.save file.
  const fs::path path = work / (c.shared_init_format == "hf" ? slug : slug + ".pt");
  if (fs::exists(path)) return path.string();
  TORCH_CHECK_VALUE(!options.python.empty() && !options.peer_script.empty(),
                    "case ", c.name, " needs shared initial weights: give strata-bench --python");
  std::vector<std::string> argv = {options.python, options.peer_script, "--write-init", path.string()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  const int rc = run_process(argv, path.string() + ".log", options.case_timeout_s);
  TORCH_CHECK(rc == 0 && fs::exists(path), "writing the initial weights ", path.string(), " failed (exit ", rc,
              "; see ", path.string(), ".log)");
  return path.string();
}

}  // namespace

std::string libtorch_version() { return TORCH_VERSION; }

int exit_code_of(const std::function<int()>& body) {
  try {
    return body();
  } catch (const c10::ValueError& e) {
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}


std::vector<std::string> gpt_command(const BenchCase& c, const std::string& gpt_binary, const std::string& data_path,
                                     const std::string& output_dir) {
  std::vector<std::string> cmd = {gpt_binary,
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
  // A shared transformers directory gives the model (strata-gpt refuses a --preset beside it).
  if (!(c.shared_init && c.shared_init_format == "hf")) cmd.insert(cmd.begin() + 1, {"--preset", c.preset});
  cmd.insert(cmd.end(), c.model_flags.begin(), c.model_flags.end());
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
  // Numbers from uncommitted changes must not be credited to the commit. The
  // index is refreshed first: a file just rewritten with the same content
  // (a checkout of the last report) only looks changed by its timestamps.
  capture(git + " update-index -q --refresh 2>/dev/null", &ignored);
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

double median_step_seconds(const std::string& metrics_csv) {
  const auto times = step_seconds(metrics_csv);
  return times.empty() ? 0.0 : compute_stats(times).median;
}

std::vector<std::string> peer_command(const BenchCase& c, const std::string& python, const std::string& peer_script,
                                      const std::string& data_path, const std::string& output_dir) {
  TORCH_CHECK_VALUE(!c.peer_mode.empty(), "case ", c.name, ": the peer has no counterpart of strategy '",
                    c.strategy, "' (its spec names no pytorch_peer mode)");
  TORCH_CHECK_VALUE(c.data == kGeneratedText, "case ", c.name, ": the peer reads the generated text only");
  std::vector<std::string> cmd = {python, peer_script,
                                  "--mode", c.peer_mode,
                                  "--nproc", std::to_string(c.nproc),
                                  "--threads-per-rank", std::to_string(c.threads_per_rank),
                                  "--precision", c.precision,
                                  "--preset", c.preset,
                                  "--data", data_path,
                                  "--batch-size", std::to_string(c.batch_size),
                                  "--max-steps", std::to_string(c.steps),
                                  "--output-dir", output_dir};
  if (c.block_size > 0) cmd.insert(cmd.end(), {"--block-size", std::to_string(c.block_size)});
  cmd.insert(cmd.end(), c.model_flags.begin(), c.model_flags.end());
  cmd.insert(cmd.end(), c.extra.begin(), c.extra.end());
  return cmd;
}

std::vector<std::string> model_shape_flags(const BenchCase& c) {
  std::vector<std::string> flags = {"--preset", c.preset};
  if (c.block_size > 0) flags.insert(flags.end(), {"--block-size", std::to_string(c.block_size)});
  flags.insert(flags.end(), c.model_flags.begin(), c.model_flags.end());
  return flags;
}

double min_step_seconds(const std::string& metrics_csv) {
  const auto times = step_seconds(metrics_csv);
  return times.empty() ? 0.0 : compute_stats(times).min;
}

namespace {

std::string slug_of(const BenchCase& c) {
  std::string slug = c.name;
  std::replace(slug.begin(), slug.end(), '/', '_');
  return slug;
}

/// Runs `c` once into work/<slug>-<tag>, with `more` flags after the case's own.
CaseRun run_once(const BenchCase& c, const RunOptions& options, int repeat, const std::string& tag,
                 const std::vector<std::string>& more) {
  const fs::path work(options.work_dir);
  const std::string data_path = (work / "generated.txt").string();
  const fs::path out_dir = work / (slug_of(c) + "-" + tag);
  const std::string log_path = out_dir.string() + ".log";
  auto argv = c.program == "peer" ? peer_command(c, options.python, options.peer_script, data_path, out_dir.string())
                                  : gpt_command(c, options.gpt_binary, data_path, out_dir.string());
  if (c.shared_init) {
    argv.insert(argv.end(), {"--init-from", shared_init_file(c, options, work)});
  }
  if (!options.inject_regression.empty() && options.inject_regression == c.name)
    argv.push_back("--debug-extra-param-copy");
  argv.insert(argv.end(), more.begin(), more.end());
  std::vector<std::string> quoted;
  for (const auto& a : argv) quoted.push_back(shell_quote(a));

  CaseRun run;
  run.bench_case = &c;
  run.repeat = repeat;
  run.command = join(quoted, " ");
  const auto start = Clock::now();
  const int64_t lo_before = loopback_tx_bytes();
  const int rc = run_process(argv, log_path, options.case_timeout_s);
  const int64_t lo_sent = loopback_tx_bytes() - lo_before;
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
    return run;
  }
  try {
    std::ifstream in(summary_path);
    run.summary = nlohmann::json::parse(in);
    // Measured here, the same way for every program (one run at a time).
    if (lo_before >= 0) run.summary["loopback_bytes"] = lo_sent;
    // A pipeline's measured bubble per rank (callbacks/pipeline_bubble.h).
    if (std::ifstream bubble(out_dir / "pipeline.json"); bubble) run.summary["pipeline"] = nlohmann::json::parse(bubble);
  } catch (const nlohmann::json::exception& e) {
    run.error = "unreadable " + summary_path.string() + ": " + e.what();
    return run;
  }
  const std::string csv = (out_dir / "metrics.csv").string();
  const double step_s = median_step_seconds(csv), best_s = min_step_seconds(csv);
  if (step_s > 0 && c.block_size > 0) run.median_step_tokens_per_s = tokens_per_step(c) / step_s;
  if (best_s > 0 && c.block_size > 0) run.best_step_tokens_per_s = tokens_per_step(c) / best_s;
  return run;
}

/// Steps strata-gpt --profile and gpt_peer.py --profile skip, then trace.
constexpr int64_t kProfileSkip = 2, kProfileSteps = 3;

/// The phase_split case's untimed run: --profile, just long enough to trace.
CaseRun profiled_run(const BenchCase& c, const RunOptions& options) {
  constexpr int64_t kNeeded = kProfileSkip + kProfileSteps + 1;  // the last step is not traced whole
  if (c.steps < kNeeded) {
    CaseRun run;
    run.bench_case = &c;
    run.profiled = true;
    run.error = "not run: the case trains " + std::to_string(c.steps) + " steps, the split needs " +
                std::to_string(kNeeded);
    return run;
  }
  BenchCase shorter = c;
  shorter.steps = kNeeded;
  const fs::path trace_dir = fs::path(options.work_dir) / (slug_of(c) + "-trace");
  fs::remove_all(trace_dir);  // a reused --work-dir's old trace must not stand in for this run's
  CaseRun run = run_once(shorter, options, 0, "profiled", {"--profile", trace_dir.string()});
  run.bench_case = &c;
  run.profiled = true;
  if (!run.error.empty()) return run;
  try {
    run.summary["phase_split"] = phase_split_file((trace_dir / "trace-rank0.json").string(), kProfileSteps).to_json();
  } catch (const std::exception& e) {  // a trace the split cannot read loses its row, not the report
    const auto* error = dynamic_cast<const c10::Error*>(&e);
    run.summary["phase_split_error"] = error ? error->what_without_backtrace() : e.what();
  }
  return run;
}

}  // namespace

std::vector<CaseRun> run_interleaved(const std::vector<BenchCase>& cases, const RunOptions& options) {
  TORCH_CHECK_VALUE(options.repeats >= 1, "--repeats must be >= 1, got ", options.repeats);
  const std::string data_path = (fs::path(options.work_dir) / "generated.txt").string();
  if (!fs::exists(data_path)) write_generated_text(data_path);

  std::vector<CaseRun> runs;
  std::set<std::string> failed;  // a case that crashed once is not run again
  for (int repeat = 0; repeat < options.repeats; ++repeat) {
    std::ostringstream tag;  // not "r" + to_string: GCC 12 warns a false -Wstringop-overflow on it
    tag << 'r' << repeat;
    for (const BenchCase& c : cases) {
      if (!c.skip_reason.empty() || failed.count(c.name)) continue;
      runs.push_back(run_once(c, options, repeat, tag.str(), {}));
      if (!runs.back().error.empty()) failed.insert(c.name);
      if (options.on_run) options.on_run(runs.back());
    }
  }
  // The per-phase split, after every timed run (bench/phase_split.h).
  for (const BenchCase& c : cases) {
    if (!c.phase_split || !c.skip_reason.empty() || failed.count(c.name)) continue;
    runs.push_back(profiled_run(c, options));
    if (options.on_run) options.on_run(runs.back());
  }
  return runs;
}

}  // namespace strata::bench
