#pragma once
// Where and when a rank writes its flight-recorder dump, and reading a
// directory of them (strategies/flight_recorder.h keeps the records).
//
// A rank dumps "<output-dir>/flight/rank<R>.json" when
//  * its training fails (a comm timeout, a peer gone, its own error), and
//  * on SIGUSR1, from the launcher (which asks every rank when one fails,
//    before it stops them) or from a user who wants to see where a running
//    job is (`kill -USR1 <pid>`); the job goes on.
// The launcher and `strata-flight DIR` read the dumps and say in one line
// what went wrong (diagnose_flight_dumps).
//
// Example (one rank):
//   DumpSignal signal;                        // first thing: before any thread
//   ...
//   auto file = std::make_shared<FlightDumpFile>(comm, out_dir / "flight");
//   DumpSignal::Action on_signal(signal, [file] { file->write(); });
//   DumpOnTerminate on_terminate(file);
//   try { train(); } catch (...) { file->write(); throw; }
#include "strata/strategies/comm.h"

#include <signal.h>

#include <filesystem>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace strata::recipes {

/// Runs an action on SIGUSR1 on a thread of its own. The constructor blocks
/// SIGUSR1 in the calling thread, which every thread started later inherits,
/// and a waiter thread takes it with sigwait(): the action runs as ordinary
/// code (it may allocate and write files), and no thread of the process
/// (Gloo's, OpenMP's) ever sees an interrupted system call. Threads started
/// before, if any, run a no-op handler instead of dying of the default
/// action. The destructor stops the waiter and restores mask and handler.
class DumpSignal {
 public:
  DumpSignal();
  ~DumpSignal();
  DumpSignal(const DumpSignal&) = delete;
  DumpSignal& operator=(const DumpSignal&) = delete;

  /// Registers what SIGUSR1 does while this object lives (one at a time).
  class Action {
   public:
    Action(DumpSignal& signal, std::function<void()> action);
    ~Action();
    Action(const Action&) = delete;
    Action& operator=(const Action&) = delete;

   private:
    DumpSignal& signal_;
  };

 private:
  void wait_loop();
  std::mutex mutex_;
  std::function<void()> action_;
  bool stopping_ = false;
  std::thread waiter_;
  sigset_t old_mask_{};
  struct sigaction old_action_ {};
};

/// One rank's dump file, "<dir>/rank<R>.json".
class FlightDumpFile {
 public:
  /// Removes this rank's dump from an earlier run (a stale one would be read
  /// as this run's). Holds a copy of `comm` (copies share the recorder), so
  /// a dump written while the rank's own Comm is torn down finds it alive.
  FlightDumpFile(Comm comm, std::filesystem::path dir);
  /// Writes the recorder's entries (atomically; creates the directory);
  /// never throws: it runs while a failure unwinds. Nothing when recording
  /// is off, the world is one rank, or nothing changed since the last write
  /// (a failing rank is asked by the launcher too: one file, written once,
  /// and no second write for the launcher's SIGTERM to cut short).
  void write() const noexcept;
  const std::filesystem::path& path() const { return path_; }

 private:
  Comm comm_;
  std::filesystem::path dir_;
  std::filesystem::path path_;
  mutable std::mutex mutex_;  // the failure path and the signal's thread may both write
  mutable int64_t written_version_ = -1;  ///< the recorder's version() last written
};

/// While it lives, std::terminate (an exception escaping a thread: Gloo's
/// worker threads abort this way on a collective mismatch, "Received data
/// size doesn't match expected size") first records the exception for the
/// launcher (record_rank_error) and writes `file`, then calls the previous
/// handler (which aborts). One at a time per process.
class DumpOnTerminate {
 public:
  explicit DumpOnTerminate(std::shared_ptr<const FlightDumpFile> file);
  ~DumpOnTerminate();
  DumpOnTerminate(const DumpOnTerminate&) = delete;
  DumpOnTerminate& operator=(const DumpOnTerminate&) = delete;

 private:
  std::terminate_handler previous_;
};

/// --flight-recorder N: a recorder of N collectives for `comm` (0: none).
void configure_flight_recorder(Comm& comm, int64_t records);

/// The dumps in `dir` ("rank*.json"), in rank order; empty when none.
std::vector<std::string> read_flight_dumps(const std::filesystem::path& dir);

/// The one-line diagnosis of the dumps in `dir`, or nullopt when it has none.
std::optional<std::string> flight_report(const std::filesystem::path& dir);

/// The launcher's line after a failed run: "strata: flight recorder: <the
/// diagnosis> (dumps in DIR; strata-flight DIR shows each rank's last
/// collectives)", to stderr; nothing when `dir` has no dump.
void print_flight_report(const std::filesystem::path& dir);

/// `strata-flight DIR [--last N]`: the diagnosis, then each rank's last N
/// collectives. DIR is a run's output directory or its flight/ directory.
int run_flight_report(int argc, char** argv);

}  // namespace strata::recipes
