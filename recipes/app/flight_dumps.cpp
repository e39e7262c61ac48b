#include "strata/recipes/app/flight_dumps.h"

#include "strata/core/atomic_file.h"
#include "strata/launch/launcher.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

namespace strata::recipes {
namespace fs = std::filesystem;

// ---- DumpSignal --------------------------------------------------------------

namespace {
extern "C" void ignore_dump_signal(int) {}

sigset_t dump_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, kDumpSignal);
  return set;
}
}  // namespace

DumpSignal::DumpSignal() {
  struct sigaction sa {};
  sa.sa_handler = ignore_dump_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(kDumpSignal, &sa, &old_action_);
  const sigset_t set = dump_signal_set();
  ::pthread_sigmask(SIG_BLOCK, &set, &old_mask_);
  waiter_ = std::thread([this] { wait_loop(); });  // inherits the blocked mask: sigwait takes the signal
}

DumpSignal::~DumpSignal() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ::pthread_kill(waiter_.native_handle(), kDumpSignal);
  waiter_.join();
  // A request arriving while the process exits must not end it (the
  // launcher would see a rank killed by a signal): what was the default
  // action becomes "ignore".
  if (old_action_.sa_handler == SIG_DFL && !(old_action_.sa_flags & SA_SIGINFO)) old_action_.sa_handler = SIG_IGN;
  ::sigaction(kDumpSignal, &old_action_, nullptr);
  ::pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

void DumpSignal::wait_loop() {
  const sigset_t set = dump_signal_set();
  for (;;) {
    int sig = 0;
    if (::sigwait(&set, &sig) != 0) continue;
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    if (action_) action_();
  }
}

DumpSignal::Action::Action(DumpSignal& signal, std::function<void()> action) : signal_(signal) {
  std::lock_guard<std::mutex> lock(signal_.mutex_);
  signal_.action_ = std::move(action);
}

DumpSignal::Action::~Action() {
  // Under the mutex: once this returns the action never runs again, so what
  // it refers to (the Comm) may go.
  std::lock_guard<std::mutex> lock(signal_.mutex_);
  signal_.action_ = nullptr;
}

// ---- FlightDumpFile ----------------------------------------------------------

FlightDumpFile::FlightDumpFile(Comm comm, fs::path dir)
    : comm_(std::move(comm)), dir_(std::move(dir)), path_(flight_dump_path(dir_.string(), comm_.rank())) {
  std::error_code ignored;
  fs::remove(path_, ignored);
}

void FlightDumpFile::write() const noexcept {
  const FlightRecorder* recorder = comm_.flight_recorder();
  if (recorder == nullptr || comm_.size() == 1) return;
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    const int64_t version = recorder->version();
    if (version == written_version_) return;
    fs::create_directories(dir_);
    write_file_atomically(path_.string(), recorder->dump(comm_.rank(), comm_.size()) + "\n");
    written_version_ = version;
    std::cerr << "[rank " << comm_.rank() << "] flight recorder: dumped " << recorder->records().size()
              << " collectives to " << path_.string() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "[rank " << comm_.rank() << "] flight recorder: cannot write " << path_.string() << ": "
              << e.what() << std::endl;
  }
}

void configure_flight_recorder(Comm& comm, int64_t records) {
  comm.set_flight_recorder(records > 0 ? std::make_shared<FlightRecorder>(static_cast<size_t>(records)) : nullptr);
}

// ---- DumpOnTerminate ---------------------------------------------------------

namespace {
// A terminate handler takes no argument: the file it writes, and the handler
// it replaced, live here while a DumpOnTerminate does (one per process).
// Atomic, and the file shared: a thread may terminate while the main thread
// destroys the DumpOnTerminate; the handler's copy keeps the file alive.
std::atomic<std::shared_ptr<const FlightDumpFile>> terminate_dump;
std::atomic<std::terminate_handler> terminate_previous{nullptr};

[[noreturn]] void dump_then_terminate() {
  if (const std::exception_ptr error = std::current_exception()) {
    try {
      std::rethrow_exception(error);
    } catch (const c10::Error& e) {
      record_rank_error(e.what_without_backtrace());
    } catch (const std::exception& e) {
      record_rank_error(e.what());
    } catch (...) {
      record_rank_error("terminated by an exception of unknown type");
    }
  }
  if (const auto file = terminate_dump.load()) file->write();
  if (const std::terminate_handler previous = terminate_previous.load()) previous();
  std::abort();
}
}  // namespace

DumpOnTerminate::DumpOnTerminate(std::shared_ptr<const FlightDumpFile> file) {
  terminate_dump.store(std::move(file));
  previous_ = std::set_terminate(dump_then_terminate);
  terminate_previous.store(previous_);
}

DumpOnTerminate::~DumpOnTerminate() {
  std::set_terminate(previous_);
  terminate_dump.store(nullptr);
  terminate_previous.store(nullptr);
}

// ---- reading -----------------------------------------------------------------

std::vector<std::string> read_flight_dumps(const fs::path& dir) {
  struct Found {
    int rank;
    std::string text;
    int world;
    fs::file_time_type written;
  };
  std::vector<Found> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    int rank = -1;
    char tail[8] = {};
    // "rank<R>.json" exactly (not the writer's ".rank<R>.json.tmp-<pid>").
    if (std::sscanf(name.c_str(), "rank%d.%7s", &rank, tail) != 2 || std::string(tail) != "json" ||
        name != "rank" + std::to_string(rank) + ".json") {
      continue;
    }
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    const auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    const int world = j.is_object() && j.contains("world_size") && j["world_size"].is_number_integer()
                          ? j["world_size"].get<int>()
                          : -1;  // not a dump: diagnose_flight_dumps names it
    found.push_back({rank, text.str(), world, entry.last_write_time(ec)});
  }
  if (found.empty()) return {};
  // The newest dump's run: a dump left by an earlier run with another world
  // size is not this run's.
  const int world = std::max_element(found.begin(), found.end(), [](const Found& a, const Found& b) {
                      return a.written < b.written;
                    })->world;
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.rank < b.rank; });
  std::vector<std::string> out;
  for (auto& f : found) {
    if (f.world == world || f.world < 0) out.push_back(std::move(f.text));
  }
  return out;
}

std::optional<std::string> flight_report(const fs::path& dir) {
  const auto dumps = read_flight_dumps(dir);
  if (dumps.empty()) return std::nullopt;
  return diagnose_flight_dumps(dumps);
}

void print_flight_report(const fs::path& dir) {
  try {
    if (const auto line = flight_report(dir)) {
      std::cerr << "strata: flight recorder: " << *line << " (dumps in " << dir.string() << "; strata-flight "
                << dir.string() << " shows each rank's last collectives)" << std::endl;
    }
  } catch (const c10::Error& e) {
    std::cerr << "strata: flight recorder: cannot read the dumps in " << dir.string() << ": "
              << e.what_without_backtrace() << std::endl;
  }
}

namespace {

constexpr const char* kFlightUsage =
    "usage: strata-flight DIR [--last N]\n"
    "  DIR       a run's output directory, or its flight/ directory of rank<R>.json dumps\n"
    "  --last N  each rank's last N collectives (default 5; 0: only the one-line diagnosis)";

std::string record_line(const nlohmann::json& r, int64_t now_ns) {
  const int64_t end = r.at("end_ns").get<int64_t>();
  const double started_s = static_cast<double>(now_ns - r.at("start_ns").get<int64_t>()) * 1e-9;
  char when[96];
  if (end < 0) {
    std::snprintf(when, sizeof(when), "in flight for %.3f s", started_s);
  } else {
    std::snprintf(when, sizeof(when), "took %.3f ms, started %.3f s before the dump",
                  static_cast<double>(end - r.at("start_ns").get<int64_t>()) * 1e-6, started_s);
  }
  std::ostringstream out;
  out << "#" << r.at("seq").get<int64_t>() << " " << r.at("group").get<std::string>() << " "
      << r.at("op").get<std::string>() << " " << r.at("dtype").get<std::string>() << " "
      << r.at("bytes").get<int64_t>() << " B";
  const std::string label = r.at("label").get<std::string>();
  if (!label.empty()) out << " [" << label << "]";
  out << ": " << when;
  return out.str();
}

}  // namespace

int run_flight_report(int argc, char** argv) {
  std::string dir;
  int64_t last = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kFlightUsage << std::endl;
      return 0;
    }
    if (a == "--last") {
      char* end = nullptr;
      last = i + 1 < argc ? std::strtoll(argv[++i], &end, 10) : -1;
      if (last < 0 || end == nullptr || *end != '\0') {
        std::cerr << "error: --last needs a whole number >= 0\n" << kFlightUsage << std::endl;
        return 2;
      }
    } else if (dir.empty() && a.rfind("--", 0) != 0) {
      dir = a;
    } else {
      std::cerr << "error: unexpected argument '" << a << "'\n" << kFlightUsage << std::endl;
      return 2;
    }
  }
  if (dir.empty()) {
    std::cerr << "error: give a directory\n" << kFlightUsage << std::endl;
    return 2;
  }
  const fs::path flight = fs::is_directory(fs::path(dir) / "flight") ? fs::path(dir) / "flight" : fs::path(dir);
  const auto dumps = read_flight_dumps(flight);
  if (dumps.empty()) {
    std::cerr << "error: no flight-recorder dump (rank<R>.json) in '" << flight.string() << "'" << std::endl;
    return 2;
  }
  try {
    std::cout << diagnose_flight_dumps(dumps) << std::endl;
    for (const auto& text : dumps) {
      if (last == 0) break;
      const auto j = nlohmann::json::parse(text);
      const auto& records = j.at("records");
      std::cout << "rank " << j.at("rank").get<int>() << ": " << records.size() << " collectives kept"
                << (records.empty() ? "" : ", the last:") << "\n";
      const size_t from = records.size() > static_cast<size_t>(last) ? records.size() - last : 0;
      for (size_t k = from; k < records.size(); ++k) {
        std::cout << "  " << record_line(records[k], j.at("now_ns").get<int64_t>()) << "\n";
      }
    }
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 2;
  }
  return 0;
}

}  // namespace strata::recipes
