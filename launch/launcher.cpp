#include "strata/launch/launcher.h"

#include "strata/launch/environment.h"
#include "strata/launch/rank_process.h"

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
#include <limits>
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

bool has_error_file(const ChildSpec& spec, struct stat* st) {
  return ::stat(spec.error_file.c_str(), st) == 0 && st->st_size > 0;
}

/// Whether `pid` is stopped (SIGSTOP, a debugger): it cannot answer a dump
/// request, nor act on SIGTERM until continued.
bool is_stopped(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = text.rfind(')');  // "pid (comm) S ...": comm may hold spaces
  return paren != std::string::npos && paren + 2 < text.size() &&
         (text[paren + 2] == 'T' || text[paren + 2] == 't');
}

/// Waits for every rank; when one fails (or a stop signal arrives) stops the
/// others: first asks each to write its flight-recorder dump and waits for
/// them (LaunchOptions::flight_dir), then SIGTERM, then SIGKILL after the
/// grace period.
class Supervisor {
 public:
  using Clock = std::chrono::steady_clock;
  Supervisor(RankSet& set, const std::vector<ChildSpec>& specs, const LaunchOptions& options)
      : set_(set), specs_(specs), options_(options) {}

  /// Returns the ranks that failed on their own, in the order they failed.
  std::vector<int> run() {
    int alive = static_cast<int>(set_.ranks_.size());
    while (alive > 0) {
      // Checked before reaping, so that ranks which die from the same Ctrl-C
      // (the terminal signals the whole process group) count as stopped.
      if (stop_signal != 0) {
        // The user stopped the job (Ctrl-C signals the whole process group):
        // ranks that die of it were stopped, not failing on their own.
        for (auto& rk : set_.ranks_) rk.signalled_by_launcher = rk.signalled_by_launcher || rk.alive;
        begin_stopping();
      }
      alive -= reap();
      // A rank that recorded an error is failing, and the others may be
      // about to fail after it: their dumps are wanted now, while they still
      // wait where they hang. Only asked, not stopped: each rank still ends
      // (and reports) on its own until the first one exits.
      if (!dumps_requested_ && !options_.flight_dir.empty() && any_live_rank_recorded_error()) request_dumps();
      advance_stop();
      if (alive == 0) break;
      // Why poll: waitpid(WNOHANG) plus a short sleep is simple and never
      // misses a signal; 10 ms is far below anything a user notices.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // The first rank to fail is usually the cause and the others its echo
    // ("connection reset by peer"): report in the order they failed.
    std::stable_sort(failed_.begin(), failed_.end(), [&](int a, int b) {
      return earlier(set_.ranks_[a].failed_at, set_.ranks_[b].failed_at);
    });
    return failed_;
  }

 private:
  enum class Phase { kRunning, kAwaitingDumps, kTerminating, kKilled };

  void signal_live(int sig) {
    for (auto& rk : set_.ranks_) {
      if (!rk.alive) continue;
      ::kill(rk.pid, sig);
      rk.signalled_by_launcher = true;
    }
  }

  void begin_stopping() {
    if (phase_ != Phase::kRunning) return;
    if (options_.flight_dir.empty()) return terminate();
    // Why ask first: a rank that is stopped now dumps where it waits; once
    // SIGTERM'd its records are gone.
    if (!dumps_requested_) request_dumps();
    phase_ = Phase::kAwaitingDumps;
  }

  /// Asks every live rank for its flight-recorder dump (a rank handles the
  /// signal on a thread of its own and goes on).
  void request_dumps() {
    dumps_requested_ = true;
    dump_requested_at_ = now_realtime();
    dumps_due_ = Clock::now() + options_.dump_wait;
    for (auto& rk : set_.ranks_) {
      if (rk.alive) ::kill(rk.pid, kDumpSignal);
    }
  }

  void terminate() {
    signal_live(SIGTERM);
    // A stopped rank acts on SIGTERM only once continued.
    signal_live(SIGCONT);
    kill_at_ = Clock::now() + options_.grace;
    phase_ = Phase::kTerminating;
  }

  void advance_stop() {
    if (phase_ == Phase::kAwaitingDumps && (Clock::now() >= dumps_due_ || all_dumped())) terminate();
    if (phase_ == Phase::kTerminating && Clock::now() >= kill_at_) {
      signal_live(SIGKILL);  // the grace period is over
      phase_ = Phase::kKilled;
    }
  }

  /// Every live rank has written its dump since the request, or cannot.
  bool all_dumped() const {
    for (size_t r = 0; r < set_.ranks_.size(); ++r) {
      const Rank& rk = set_.ranks_[r];
      if (!rk.alive || is_stopped(rk.pid)) continue;
      struct stat st {};
      const std::string path = flight_dump_path(options_.flight_dir, first_rank() + static_cast<int>(r));
      if (::stat(path.c_str(), &st) != 0) return false;
      // 20 ms: file times tick coarser than the clock.
      const int64_t written = st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
      const int64_t asked = dump_requested_at_.tv_sec * 1000000000LL + dump_requested_at_.tv_nsec;
      if (written < asked - 20000000LL) return false;
    }
    return true;
  }

  bool any_live_rank_recorded_error() const {
    for (size_t r = 0; r < set_.ranks_.size(); ++r) {
      struct stat st {};
      if (set_.ranks_[r].alive && has_error_file(specs_[r], &st)) return true;
    }
    return false;
  }

  /// Reaps every rank that has exited (before anyone is signalled, so that a
  /// rank which failed on its own is never mistaken for one the launcher
  /// stopped); returns how many; a failure starts stopping the rest.
  int reap() {
    int reaped = 0;
    bool new_failure = false;
    for (size_t r = 0; r < set_.ranks_.size(); ++r) {
      Rank& rk = set_.ranks_[r];
      if (!rk.alive) continue;
      const pid_t got = ::waitpid(rk.pid, &rk.status, WNOHANG);
      if (got == 0 || (got < 0 && errno == EINTR)) continue;
      // got == pid, or an error (ECHILD: someone else reaped it): either way it is gone.
      rk.alive = false;
      ++reaped;
      if (got < 0) rk.status = 0;
      const bool ok = WIFEXITED(rk.status) && WEXITSTATUS(rk.status) == 0;
      // Ranks install no SIGTERM handler, so one we signalled and that died
      // by a signal was stopped by us, unless it had already recorded an
      // error of its own: a rank that throws writes its error file first and
      // may still be tearing down (closing connections, which makes its peers
      // fail) when our signal arrives. One that exited with a code of its own
      // failed before our signal arrived (it lost the race with another rank).
      struct stat st {};
      const bool recorded = has_error_file(specs_[r], &st);
      // A rank that died of the dump request was outside the dump signal's
      // lifetime (starting or exiting): the launcher's doing, not a failure.
      const bool by_dump_request =
          dumps_requested_ && WIFSIGNALED(rk.status) && WTERMSIG(rk.status) == kDumpSignal && !recorded;
      const bool stopped_by_us = (rk.signalled_by_launcher && WIFSIGNALED(rk.status) && !recorded) || by_dump_request;
      if (ok || stopped_by_us) continue;
      rk.failed_at = recorded ? failure_time(specs_[r].error_file, st) : now_realtime();
      failed_.push_back(static_cast<int>(r));
      new_failure = true;
    }
    // Why stop the rest: their next collective would wait on the dead rank
    // until the timeout; stop them now.
    if (new_failure) begin_stopping();
    return reaped;
  }

  int first_rank() const { return options_.node_rank * options_.nproc; }

  RankSet& set_;
  const std::vector<ChildSpec>& specs_;
  const LaunchOptions& options_;
  std::vector<int> failed_;  ///< ranks that failed on their own (not stopped by us)
  Phase phase_ = Phase::kRunning;
  bool dumps_requested_ = false;
  timespec dump_requested_at_{};
  Clock::time_point dumps_due_;
  Clock::time_point kill_at_;
};

}  // namespace

int launch_ranks(const std::vector<std::string>& argv, const LaunchOptions& options) {
  check_launch_options(argv, options);
  const int nproc = options.nproc;
  const int first_rank = options.node_rank * nproc;
  RankSet set(make_temp_dir());
  if (!options.flight_dir.empty()) {
    // A dump from an earlier run in the same directory is not this run's;
    // one machine's launcher owns them all (an earlier run may have had
    // more ranks), several machines' each their own ranks'.
    const int last = options.nnodes == 1 ? std::numeric_limits<int>::max() : first_rank + nproc;
    std::error_code ignored;
    for (int r = options.nnodes == 1 ? 0 : first_rank; r < last; ++r) {
      if (!std::filesystem::remove(flight_dump_path(options.flight_dir, r), ignored) && r >= first_rank + nproc) break;
    }
  }
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

  const std::vector<int> failed = Supervisor(set, specs, options).run();
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

std::string flight_dump_path(const std::string& dir, int rank) {
  return (std::filesystem::path(dir) / ("rank" + std::to_string(rank) + ".json")).string();
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
