#pragma once
// Child processes for tests that start ranks (or whole launchers) themselves,
// the way torchrun, srun, mpirun or `ip netns exec` would: an exact
// environment, output to a file, a bounded wait, and no process left behind
// (the destructor kills the child's whole process group and reaps it).
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace strata::testing {

/// The test's own environment minus every launcher variable (torchrun's,
/// SLURM's, Open MPI's, strata's), as a real launcher would pass it on. Not an
/// empty one: variables such as OPENBLAS_CORETYPE pick BLAS kernels, and so the
/// last digits of a loss (measured: 2.470026255 vs 2.470026016 at step 1).
inline std::vector<std::string> base_environment() {
  static const char* const exact[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                      "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME"};
  static const char* const prefixes[] = {"GROUP_", "ROLE_", "SLURM_", "OMPI_", "PMI", "TORCHELASTIC_", "STRATA_"};
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    bool launcher = false;
    for (const char* x : exact) launcher = launcher || name == x;
    for (const char* p : prefixes) launcher = launcher || name.rfind(p, 0) == 0;
    if (!launcher) env.push_back(entry);
  }
  return env;
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class Process {
 public:
  /// Starts argv[0] (an absolute path) with exactly `env`, stdout and stderr
  /// to `log`, in a process group of its own.
  Process(const std::vector<std::string>& argv, const std::vector<std::string>& env,
          std::filesystem::path log)
      : log_(std::move(log)) {
    std::vector<std::string> a = argv, e = env;
    std::vector<char*> args, envp;
    for (auto& s : a) args.push_back(s.data());
    args.push_back(nullptr);
    for (auto& s : e) envp.push_back(s.data());
    envp.push_back(nullptr);
    const std::string log_path = log_.string();
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      // Even if the test itself is killed (a ctest timeout), nothing it
      // started may run on: the child dies with it (strata's launcher then
      // takes its ranks down the same way).
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      ::setpgid(0, 0);
      const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execve(args[0], args.data(), envp.data());
      ::_exit(127);
    }
    if (pid_ > 0) ::setpgid(pid_, pid_);  // also here: no race with kill() below
  }
  ~Process() {
    if (running()) {
      ::kill(-pid_, SIGKILL);
      ::kill(pid_, SIGKILL);
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  bool started() const { return pid_ > 0; }
  bool running() const { return pid_ > 0 && !exit_code_; }
  pid_t pid() const { return pid_; }

  /// The exit code (128 + signal when killed), or nullopt if still running
  /// after `limit`.
  std::optional<int> wait_for(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (running()) {
      int status = 0;
      const pid_t got = ::waitpid(pid_, &status, WNOHANG);
      if (got == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (got < 0 && errno != EINTR) {
        exit_code_ = -1;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return exit_code_;
  }

  std::string output() const { return read_text(log_); }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

/// A directory named after `stem` and this process, created now and removed
/// with everything in it when destroyed (use a function-local static for one
/// per test binary, removed at exit).
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& stem)
      : path_(std::filesystem::temp_directory_path() / (stem + "-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// Polls `ready` every 20 ms until it holds or `limit` passes.
template <typename Predicate>
bool wait_until(Predicate ready, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

/// "step loss val_loss" of every row of a metrics.csv, as text (exact
/// comparison: identical runs print identical digits).
inline std::vector<std::string> losses_of(const std::filesystem::path& metrics_csv) {
  std::ifstream in(metrics_csv);
  std::string line;
  std::vector<std::string> out;
  if (!std::getline(in, line)) return out;
  std::vector<std::string> header;
  {
    std::stringstream h(line);
    for (std::string cell; std::getline(h, cell, ',');) header.push_back(cell);
  }
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream row(line);
    for (std::string cell; std::getline(row, cell, ',');) cells.push_back(cell);
    cells.resize(header.size());
    std::string picked;
    for (size_t i = 0; i < header.size(); ++i) {
      if (header[i] == "step" || header[i] == "loss" || header[i] == "val_loss") picked += cells[i] + " ";
    }
    out.push_back(picked);
  }
  return out;
}

}  // namespace strata::testing
