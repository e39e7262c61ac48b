#include "strata/launch/rank_process.h"

#include "strata/launch/environment.h"

#include <signal.h>
#include <sys/prctl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

namespace strata {

namespace {

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

}  // namespace

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
  // Ignored until the rank takes it (recipes/app/flight_dumps.h): a dump
  // request that reaches a rank still starting must not end it.
  ::signal(kDumpSignal, SIG_IGN);
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

namespace {

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

}  // namespace

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

}  // namespace strata
