#include "strata/launch/launcher.h"

#include "strata/launch/environment.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <signal.h>
#include <time.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

namespace strata {

namespace {

// ---------------------------------------------------------------------------
// Launcher signal handling.
//
// The one piece of file-static state: a signal handler can only communicate
// through a variable of static storage duration. It holds the signal number
// that asked the launcher to stop (0: none). launch_ranks() resets it on entry;
// running two launches in one process at the same time is not supported.
volatile sig_atomic_t stop_signal = 0;

extern "C" void on_stop_signal(int sig) { stop_signal = sig; }

/// Installs the stop handler for SIGINT and SIGTERM; restores the previous
/// handlers when destroyed.
class StopSignals {
 public:
  StopSignals() {
    stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// ---------------------------------------------------------------------------
// Child processes

/// Writes a decimal number with write(2) only (async-signal-safe, for the
/// child between fork and exec).
void write_number(int fd, int value) {
  char buf[16];
  int i = sizeof(buf);
  unsigned v = value < 0 ? static_cast<unsigned>(-value) : static_cast<unsigned>(value);
  do {
    buf[--i] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0 && i > 1);
  if (value < 0) buf[--i] = '-';
  ssize_t ignored = ::write(fd, buf + i, sizeof(buf) - i);
  (void)ignored;
}

/// Everything a child needs, prepared before fork(): after fork() in a
/// multi-threaded process only async-signal-safe calls are allowed, so no
/// allocation happens there.
struct ChildSpec {
  std::vector<std::string> env_storage;
  std::vector<char*> envp;
  std::string error_file;
  std::string exec_failed_message;
};

[[noreturn]] void exec_child(const std::vector<char*>& argv, const ChildSpec& spec, pid_t parent) {
  // If the launcher dies (even by SIGKILL) the ranks must not linger.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl
  // Exec resets caught signals, not blocked ones: start the rank unblocked and
  // with default SIGINT/SIGTERM dispositions.
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  ::execve(argv[0], argv.data(), spec.envp.data());
  const int err = errno;
  const int fd = ::open(spec.error_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ssize_t ignored = ::write(fd, spec.exec_failed_message.data(), spec.exec_failed_message.size());
    (void)ignored;
    write_number(fd, err);
    ignored = ::write(fd, "\n", 1);
    ::close(fd);
  }
  ::_exit(127);
}

std::string first_line_of(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return {};
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
    line.pop_back();
  return line;
}

/// When a rank failed, from its error file: the "time_ns=<ns since the epoch>"
/// line record_rank_error() writes after the message (file timestamps tick
/// every few milliseconds, too coarse to order two failures), else the file's
/// mtime (a file written by something else).
timespec failure_time(const std::string& path, const struct stat& st) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("time_ns=", 0) != 0) continue;
    try {
      const long long ns = std::stoll(line.substr(8));
      return timespec{static_cast<time_t>(ns / 1000000000LL), static_cast<long>(ns % 1000000000LL)};
    } catch (const std::exception&) {
      break;
    }
  }
  return st.st_mtim;
}

/// Variables the launcher sets (or, like MASTER_PORT on one machine and the
/// torchrun agent's store flag, must not pass on): never inherited.
const char* const kLaunchVars[] = {"RANK",
                                   "WORLD_SIZE",
                                   "LOCAL_RANK",
                                   "LOCAL_WORLD_SIZE",
                                   "MASTER_ADDR",
                                   "MASTER_PORT",
                                   "OMP_NUM_THREADS",
                                   "STRATA_THREADS_PER_RANK",
                                   "STRATA_ERROR_FILE",
                                   "STRATA_STORE_FILE",
                                   "TORCHELASTIC_USE_AGENT_STORE"};

struct Rank {
  pid_t pid = -1;
  bool alive = false;
  bool signalled_by_launcher = false;  ///< we sent it SIGTERM/SIGKILL before it was reaped
  int status = 0;
  timespec failed_at{};  ///< when it failed: its error file's time (failure_time), else when reaped
};

timespec now_realtime() {
  timespec t{};
  ::clock_gettime(CLOCK_REALTIME, &t);
  return t;
}

bool earlier(const timespec& a, const timespec& b) {
  return a.tv_sec != b.tv_sec ? a.tv_sec < b.tv_sec : a.tv_nsec < b.tv_nsec;
}

/// Owns the spawned ranks: whatever happens (including an exception in the
/// launcher), no rank outlives launch_ranks().
class RankSet {
 public:
  explicit RankSet(std::filesystem::path dir) : dir_(std::move(dir)) {}
  ~RankSet() {
    for (auto& r : ranks_) {
      if (!r.alive) continue;
      ::kill(r.pid, SIGKILL);
      // Why waitpid: reap so that no zombie is left behind.
      while (::waitpid(r.pid, &r.status, 0) < 0 && errno == EINTR) {
      }
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  RankSet(const RankSet&) = delete;
  RankSet& operator=(const RankSet&) = delete;

  std::vector<Rank> ranks_;
  std::filesystem::path dir_;
};

std::filesystem::path make_temp_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/strata-launch-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  TORCH_CHECK(::mkdtemp(buf.data()) != nullptr, "launch_ranks: cannot create a temporary directory ",
              pattern, ": ", std::strerror(errno));
  return std::filesystem::path(buf.data());
}

}  // namespace

// ---------------------------------------------------------------------------

namespace {

void check_launch_options(const std::vector<std::string>& argv, const LaunchOptions& options) {
  TORCH_CHECK(!argv.empty(), "launch_ranks: argv is empty (argv[0] must be the executable)");
  TORCH_CHECK(options.nproc >= 1, "launch_ranks: nproc ", options.nproc, " must be >= 1");
  TORCH_CHECK(options.threads_per_rank >= 0, "launch_ranks: threads_per_rank ",
              options.threads_per_rank, " must be >= 0");
  TORCH_CHECK(options.grace.count() >= 0, "launch_ranks: grace ", options.grace.count(),
              " s must be >= 0");
  TORCH_CHECK(options.nnodes >= 1, "launch_ranks: nnodes ", options.nnodes, " must be >= 1");
  TORCH_CHECK(options.node_rank >= 0 && options.node_rank < options.nnodes, "launch_ranks: node_rank ",
              options.node_rank, " is outside [0, nnodes ", options.nnodes, ")");
  TORCH_CHECK(options.nnodes == 1 || (options.master_port >= 1 && options.master_port <= 65535),
              "launch_ranks: master_port ", options.master_port, " must be in [1, 65535] with nnodes ",
              options.nnodes, ": every node's ranks meet rank 0's store at that port");
}

/// Each local rank's environment (ours minus the variables we set, plus the
/// torchrun variables) and error file, in `dir`.
std::vector<ChildSpec> child_specs(const std::vector<std::string>& argv, const LaunchOptions& options,
                                   const std::filesystem::path& dir) {
  const int nproc = options.nproc;
  const int world_size = options.nnodes * nproc;
  const int first_rank = options.node_rank * nproc;
  const bool one_machine = options.nnodes == 1;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int threads = options.threads_per_rank > 0 ? options.threads_per_rank
                                                   : std::max(1, static_cast<int>(cores) / nproc);
  std::vector<std::string> base_env;
  for (const auto& [key, value] : current_environment()) {
    if (std::find(std::begin(kLaunchVars), std::end(kLaunchVars), key) == std::end(kLaunchVars))
      base_env.push_back(key + "=" + value);
  }
  // Why a FileStore on one machine: the ranks share a filesystem, so they can
  // meet without any listening socket — no port to pick (and lose to another
  // process before rank 0 binds it), nothing reachable from the network.
  // c10d's TCPStore server would listen on every interface (measured with
  // `ss -ltn`: *:PORT whatever host it is given).
  const std::string store_file = one_machine ? (dir / "store").string() : std::string();
  std::vector<ChildSpec> specs(nproc);
  for (int r = 0; r < nproc; ++r) {
    ChildSpec& s = specs[r];
    const int rank = first_rank + r;
    s.error_file = (dir / ("rank-" + std::to_string(rank) + ".err")).string();
    s.exec_failed_message = "cannot execute " + argv[0] + ": errno ";
    s.env_storage = base_env;
    std::vector<std::pair<std::string, std::string>> vars = {
        {"RANK", std::to_string(rank)},
        {"WORLD_SIZE", std::to_string(world_size)},
        {"LOCAL_RANK", std::to_string(r)},
        {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
        {"MASTER_ADDR", options.master_addr},
        {"OMP_NUM_THREADS", std::to_string(threads)},
        {"STRATA_THREADS_PER_RANK", std::to_string(threads)},
        {"STRATA_ERROR_FILE", s.error_file}};
    if (one_machine) {
      vars.emplace_back("STRATA_STORE_FILE", store_file);
    } else {
      vars.emplace_back("MASTER_PORT", std::to_string(options.master_port));
    }
    for (const auto& [key, value] : vars) s.env_storage.push_back(key + "=" + value);
    for (auto& e : s.env_storage) s.envp.push_back(e.data());
    s.envp.push_back(nullptr);
  }
  return specs;
}

/// Waits for every rank; when one fails (or a stop signal arrives) stops the
/// others, SIGTERM then SIGKILL after the grace period. Returns the ranks
/// that failed on their own, in the order they failed.
std::vector<int> supervise(RankSet& set, const std::vector<ChildSpec>& specs, const LaunchOptions& options) {
  using Clock = std::chrono::steady_clock;
  const int nproc = static_cast<int>(set.ranks_.size());
  std::vector<int> failed;  // ranks that failed on their own (not stopped by us)
  bool stopping = false;
  bool killed = false;
  Clock::time_point kill_at;
  auto stop_all = [&](int sig) {
    for (auto& rk : set.ranks_) {
      if (!rk.alive) continue;
      ::kill(rk.pid, sig);
      rk.signalled_by_launcher = true;
    }
  };
  auto begin_stopping = [&] {
    if (stopping) return;
    stopping = true;
    stop_all(SIGTERM);
    kill_at = Clock::now() + options.grace;
  };
  int alive = nproc;
  while (alive > 0) {
    // Checked before reaping, so that ranks which die from the same Ctrl-C
    // (the terminal signals the whole process group) count as stopped.
    if (stop_signal != 0) begin_stopping();
    // Reap everything that has exited before signalling anyone, so that a rank
    // which failed on its own is never mistaken for one the launcher stopped.
    bool new_failure = false;
    for (int r = 0; r < nproc; ++r) {
      Rank& rk = set.ranks_[r];
      if (!rk.alive) continue;
      const pid_t got = ::waitpid(rk.pid, &rk.status, WNOHANG);
      if (got == 0 || (got < 0 && errno == EINTR)) continue;
      // got == pid, or an error (ECHILD: someone else reaped it): either way it is gone.
      rk.alive = false;
      --alive;
      if (got < 0) rk.status = 0;
      const bool ok = WIFEXITED(rk.status) && WEXITSTATUS(rk.status) == 0;
      // Ranks install no SIGTERM handler, so one we signalled and that died
      // by a signal was stopped by us, unless it had already recorded an
      // error of its own: a rank that throws writes its error file first and
      // may still be tearing down (closing connections, which makes its peers
      // fail) when our signal arrives. One that exited with a code of its own
      // failed before our signal arrived (it lost the race with another rank).
      struct stat st {};
      const bool has_error_file = ::stat(specs[r].error_file.c_str(), &st) == 0 && st.st_size > 0;
      const bool stopped_by_us = rk.signalled_by_launcher && WIFSIGNALED(rk.status) && !has_error_file;
      if (ok || stopped_by_us) continue;
      rk.failed_at = has_error_file ? failure_time(specs[r].error_file, st) : now_realtime();
      failed.push_back(r);
      new_failure = true;
    }
    // Why stop the rest: their next collective would wait on the dead rank
    // until the timeout; stop them now.
    if (new_failure) begin_stopping();
    if (stopping && !killed && Clock::now() >= kill_at) {
      stop_all(SIGKILL);  // the grace period is over
      killed = true;
    }
    if (alive == 0) break;
    // Why poll: waitpid(WNOHANG) plus a short sleep is simple and never
    // misses a signal; 10 ms is far below anything a user notices.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // The first rank to fail is usually the cause and the others its echo
  // ("connection reset by peer"): report in the order they failed.
  std::stable_sort(failed.begin(), failed.end(), [&](int a, int b) {
    return earlier(set.ranks_[a].failed_at, set.ranks_[b].failed_at);
  });
  return failed;
}

}  // namespace

int launch_ranks(const std::vector<std::string>& argv, const LaunchOptions& options) {
  check_launch_options(argv, options);
  const int nproc = options.nproc;
  const int first_rank = options.node_rank * nproc;
  RankSet set(make_temp_dir());
  const std::vector<ChildSpec> specs = child_specs(argv, options, set.dir_);
  std::vector<std::string> argv_storage = argv;
  std::vector<char*> child_argv;
  for (auto& a : argv_storage) child_argv.push_back(a.data());
  child_argv.push_back(nullptr);

  // Installed before the first fork, so a Ctrl-C from here on is forwarded
  // rather than killing the launcher and orphaning ranks.
  StopSignals signals;
  const pid_t self = ::getpid();
  set.ranks_.resize(nproc);
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = ::fork();
    TORCH_CHECK(pid >= 0, "launch_ranks: fork failed for rank ", r, " of ", nproc, ": ",
                std::strerror(errno));  // RankSet's destructor stops those already started
    if (pid == 0) exec_child(child_argv, specs[r], self);
    set.ranks_[r].pid = pid;
    set.ranks_[r].alive = true;
  }

  const std::vector<int> failed = supervise(set, specs, options);
  // In the order supervise() gives (the root cause first); ranks that failed
  // alike (a collective error every rank raised) share one line.
  std::vector<std::pair<std::string, std::vector<int>>> lines;
  for (int r : failed) {
    const int status = set.ranks_[r].status;
    std::string how = WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                          : "exit code " + std::to_string(WEXITSTATUS(status));
    std::string message = first_line_of(specs[r].error_file);
    if (message.empty()) message = "no error message";
    const std::string text = " failed (" + how + "): " + message;
    auto same = std::find_if(lines.begin(), lines.end(), [&](const auto& l) { return l.first == text; });
    if (same == lines.end()) same = lines.insert(lines.end(), {text, {}});
    same->second.push_back(first_rank + r);
  }
  for (const auto& [text, ranks] : lines) {
    std::cerr << "strata: rank" << (ranks.size() > 1 ? "s " : " ") << c10::Join(", ", ranks) << text << "\n";
  }
  const int sig = stop_signal;
  if (sig != 0) {
    std::cerr << "strata: launcher received signal " << sig << "; stopped the ranks\n";
  }
  std::cerr.flush();
  if (sig != 0) return 128 + sig;
  return failed.empty() ? 0 : 1;
}

std::string rank_error_file() {
  const char* path = std::getenv("STRATA_ERROR_FILE");
  return path ? std::string(path) : std::string();
}

void record_rank_error(const std::string& message) {
  try {
    const std::string path = rank_error_file();
    if (path.empty()) return;
    // The first error a rank records is its root cause; later ones (from
    // unwinding) must not replace it or move its timestamp.
    std::error_code ec;
    if (std::filesystem::file_size(path, ec) > 0 && !ec) return;
    std::ofstream out(path, std::ios::trunc);
    // The time on a line of its own: the launcher orders failures by it.
    const timespec t = now_realtime();
    out << message << "\ntime_ns=" << static_cast<long long>(t.tv_sec) * 1000000000LL + t.tv_nsec << "\n";
  } catch (...) {
    // Reporting an error must never raise another one.
  }
}

}  // namespace strata
