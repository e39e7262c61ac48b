#pragma once
// Launcher: run a binary as N local ranks, like torchrun's agent.
//
// launch_ranks() re-executes a binary N times with the torchrun environment
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
// or, on one machine, STRATA_STORE_FILE), waits, and if one rank fails stops
// the others and returns non-zero with a message naming the rank and its
// error. SIGINT/SIGTERM to the launcher are forwarded to every rank. Ranks report their error through a file
// (torchrun's TORCHELASTIC_ERROR_FILE idea), see record_rank_error().
#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

namespace strata {

struct LaunchOptions {
  int nproc = 1;                ///< ranks on this machine
  /// Machines in the job, each running one launcher (torchrun's --nnodes).
  /// One machine: the ranks meet in a c10d FileStore in the launcher's
  /// temporary directory (STRATA_STORE_FILE), so no port is opened. Several:
  /// rank 0 (on node 0) hosts a TCP store on master_addr:master_port.
  int nnodes = 1;
  int node_rank = 0;            ///< this machine: ranks node_rank*nproc .. +nproc-1
  /// The address ranks meet at. One machine: Gloo binds to the local address
  /// that routes to it (127.0.0.1: loopback only). Several: node 0's address.
  std::string master_addr = "127.0.0.1";
  int master_port = 0;          ///< the TCP store's port; required when nnodes > 1
  int threads_per_rank = 0;     ///< 0: cores / nproc (at least 1)
  std::chrono::seconds grace{5};///< SIGTERM -> SIGKILL delay when stopping ranks
  /// Where ranks write their flight-recorder dumps (flight_dump_path); ""
  /// none. When a rank fails (it records an error or exits non-zero) or a
  /// stop signal arrives, the launcher first asks every live rank to dump
  /// (kDumpSignal) and waits for them, at most `dump_wait` and not for a
  /// rank that is stopped (SIGSTOP, a debugger), then stops them.
  std::string flight_dir;
  std::chrono::milliseconds dump_wait{2000};
};

/// The signal that asks a rank to write its flight-recorder dump.
constexpr int kDumpSignal = SIGUSR1;
/// Rank `rank`'s dump in `dir`: "<dir>/rank<rank>.json".
std::string flight_dump_path(const std::string& dir, int rank);

/// Spawns the ranks and waits. Returns 0 if all succeeded, else non-zero after
/// printing "strata: rank R failed (exit code C): <its error>" to stderr.
int launch_ranks(const std::vector<std::string>& argv, const LaunchOptions& options);

/// Error file a rank writes its one-line error to, so the launcher can name it
/// (torchrun's TORCHELASTIC_ERROR_FILE idea). Empty when not launched by us.
std::string rank_error_file();
/// Writes `message` to rank_error_file() if set and no error was recorded yet
/// (the first error is the root cause); never throws.
void record_rank_error(const std::string& message);

}  // namespace strata
