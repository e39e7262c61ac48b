// strata-bench --suite checkpoint: save and load time, bytes written per rank
// and peak tensor memory per rank for model presets (any built-in family) under FSDP on 4 processes,
// in both checkpoint formats, next to the disk's own sequential write speed
// (write + fsync of 256 MiB in the same directory, median of 3). A checkpoint
// holds 12 bytes per parameter with fp32 AdamW (values, exp_avg,
// exp_avg_sq: the 16Ψ' of model state less the gradients): "total / 12Ψ'"
// is 1.0 when every byte is written once across the ranks.
//
//   build/bin/strata-bench --suite checkpoint [--presets gpt-mini,gpt2] [--dir D] [--json F]
//
// strata-bench launches itself on 4 ranks (launch/launcher.h); each rank
// builds the model deferred under FSDP, creates the AdamW state (zeros: the
// bytes are what matters), then saves and reloads each format, measuring
// its own MemoryTracker peak from just before each phase. No training step:
// the numbers are the checkpoint's alone.
#include "strata/bench/checkpoint_bench.h"
#include "strata/bench/harness.h"

#include <c10/util/StringUtil.h>

#include "strata/core/atomic_file.h"
#include "strata/core/training_module.h"
#include "strata/launch/environment.h"
#include "strata/launch/launcher.h"
#include "strata/recipes/models/spec.h"
#include "strata/strategies/fsdp/fully_sharded.h"
#include "strata/strategies/process_group.h"
#include "strata/trainer/checkpoint.h"
#include "strata/trainer/memory.h"
#include "strata/trainer/trainer.h"

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace strata::bench {
namespace {
namespace fs = std::filesystem;
namespace po = boost::program_options;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kRanks = 4;

std::string self_executable(const char* argv0) {
  std::error_code ec;
  auto path = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(argv0) : path.string();
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// MB/s of writing and fsyncing `bytes` to a new file in `dir`.
double disk_write_mb_per_s(const fs::path& dir, int64_t bytes) {
  const auto path = dir / "disk-speed.bin";
  std::vector<char> buf(8 << 20, 1);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TORCH_CHECK(fd >= 0, "cannot create ", path.string());
  const auto start = Clock::now();
  for (int64_t done = 0; done < bytes;) {
    const ssize_t w = ::write(fd, buf.data(), std::min<int64_t>(static_cast<int64_t>(buf.size()), bytes - done));
    TORCH_CHECK(w > 0, "write to ", path.string(), " failed");
    done += w;
  }
  TORCH_CHECK(::fsync(fd) == 0, "fsync failed");
  const double s = seconds_since(start);
  ::close(fd);
  fs::remove(path);
  return static_cast<double>(bytes) / 1e6 / s;
}

/// `preset` as the suite measures every family: GPT-2's vocabulary of 50304
/// (padded) and a context of 1024.
recipes::ModelPtr suite_model(const recipes::ModelRegistry& models, const std::string& preset) {
  recipes::ModelRequest request;
  request.preset = preset;
  request.vocab_size = 50304;
  request.block_size = 1024;
  return models.resolve(request);
}

/// One rank's work (run under the launcher): writes rank-<r>.json into dir.
int run_worker(const DistEnv& env, const recipes::ModelRegistry& models, const std::string& preset,
               const fs::path& dir) {
  MemoryTracker memory;
  Comm comm = create_world_comm(ProcessGroupOptions(env.rank, env.world_size)
                                    .master_addr(env.master_addr)
                                    .master_port(env.master_port)
                                    .store_file(env.store_file)
                                    .timeout(std::chrono::minutes(10)),
                                torch::kCPU);
  torch::manual_seed(1337);
  const recipes::ModelPtr model = suite_model(models, preset);
  const auto built = model->build(/*deferred=*/true);
  TrainingModule& module = *built;
  FSDPStrategy strategy(comm);
  strategy.setup(module);
  const TrainerOptions options;
  auto optimizer = strategy.setup_optimizer(make_optimizer_groups(module.module(), options), optimizer_factory(options));
  Strategy::create_optimizer_state(*optimizer);
  const auto state = strategy.model_state_bytes(*optimizer);
  json out{{"rank", env.rank}, {"preset", preset}, {"params", model->parameters()},
           {"state_bytes", state.params + state.optimizer}};
  for (const std::string format : {"sharded", "full"}) {
    const auto ckpt = dir / (preset + "-" + format);
    if (env.rank == 0) fs::remove_all(ckpt);
    comm.barrier();  // Why: nobody writes into a directory rank 0 is clearing
    CheckpointMeta meta;
    meta.world_size = env.world_size;
    meta.strategy = strategy.name();
    meta.format = format;
    memory.reset_peak();
    const int64_t before = memory.current_bytes();
    const auto saved = save_checkpoint(ckpt.string(), strategy, *optimizer, meta);
    const int64_t save_peak = memory.peak_bytes();
    comm.barrier();  // Why: loads start together, as in a resume
    memory.reset_peak();
    const auto start = Clock::now();
    load_checkpoint(ckpt.string(), strategy, *optimizer, meta);
    const double load_s = seconds_since(start);
    const int64_t load_peak = memory.peak_bytes();
    out[format] = {{"save_s", saved.seconds}, {"load_s", load_s}, {"bytes_written", saved.bytes_written},
                   {"base_bytes", before}, {"save_peak_bytes", save_peak}, {"load_peak_bytes", load_peak}};
  }
  std::ofstream(dir / ("rank-" + std::to_string(env.rank) + "-" + preset + ".json")) << out.dump();
  return 0;
}

std::string mib(double bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << bytes / (1 << 20);
  return out.str();
}
}  // namespace

/// Exit-2 errors before anything is written: unknown presets, a --dir that
/// is not a new or empty directory (the suite writes and deletes checkpoints
/// there), a --json file that cannot be written.
void check_suite_input(const std::vector<std::string>& presets, const recipes::ModelRegistry& models,
                       const std::string& dir, const std::string& json_path) {
  const auto known = models.preset_names();
  for (const auto& p : presets) {
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    TORCH_CHECK_VALUE(std::find(known.begin(), known.end(), p) != known.end(), "--presets: unknown preset '", p,
                      "'; available: ", list);
  }
  std::error_code ec;
  if (!dir.empty() && fs::exists(dir, ec)) {
    TORCH_CHECK_VALUE(fs::is_directory(dir, ec) && fs::is_empty(dir, ec), "--dir '", dir,
                      "' must be a new or empty directory (the suite writes and deletes checkpoints there)");
    const std::string problem = directory_write_problem(dir);
    TORCH_CHECK_VALUE(problem.empty(), "--dir '", dir, "' does not take new files (", problem, ")");
  }
  if (!json_path.empty()) {
    const std::string problem = output_file_problem(json_path);
    TORCH_CHECK_VALUE(problem.empty(), "--json '", json_path, "' cannot be written: ", problem);
  }
}

/// The table's two rows (sharded, full) of `preset` from its ranks' results.
void append_rows(std::ostream& table, const std::string& preset, const std::vector<json>& ranks, double disk) {
  const double params = ranks[0]["params"].get<double>();
  for (const std::string format : {"sharded", "full"}) {
    double save_s = 0, load_s = 0, total = 0;
    std::string per_rank;
    for (const auto& r : ranks) {
      save_s = std::max(save_s, r[format]["save_s"].get<double>());
      load_s = std::max(load_s, r[format]["load_s"].get<double>());
      total += r[format]["bytes_written"].get<double>();
      per_rank += (per_rank.empty() ? "" : " / ") + mib(r[format]["bytes_written"].get<double>());
    }
    const double mbps = total / 1e6 / save_s;
    table << "| " << preset << " | " << format << " | " << std::setprecision(2) << save_s << " | " << load_s << " | "
          << per_rank << " | " << std::setprecision(3) << total / (12.0 * params) << " | " << std::setprecision(0)
          << mbps << " (" << 100.0 * mbps / disk << "%) | " << mib(ranks[0][format]["save_peak_bytes"].get<double>())
          << " / " << mib(ranks[0][format]["load_peak_bytes"].get<double>()) << " | "
          << mib(ranks[0][format]["base_bytes"].get<double>()) << " |\n";
  }
}

/// The disk's sequential write speed (into `disk`, MB/s) and the table's header.
std::string table_header(const fs::path& dir, double& disk) {
  // Median of three: on a shared machine single runs vary several-fold
  // (write-back caching, other writers).
  std::vector<double> runs;
  for (int i = 0; i < 3; ++i) runs.push_back(disk_write_mb_per_s(dir, int64_t{256} << 20));
  std::sort(runs.begin(), runs.end());
  disk = runs[1];
  std::ostringstream table;
  table << std::fixed << "disk sequential write (256 MiB + fsync, median of 3: " << std::setprecision(0) << runs[0] << " / " << runs[1] << " / " << runs[2] << "): " << std::fixed << std::setprecision(0) << disk << " MB/s\n\n"
        << "| preset | format | save s | load s | bytes written per rank (MiB) | total / 12Ψ' | save MB/s (% of disk) "
           "| rank 0 peak save / load (MiB) | rank 0 state before (MiB) |\n|---|---|---|---|---|---|---|---|---|\n";
  return table.str();
}

int checkpoint_suite(int argc, char** argv, const recipes::ModelRegistry& models) {
  // The bench family's checkpoint presets (BenchWorkloads::checkpoint).
  std::string presets = c10::Join(",", models.bench_family().bench().checkpoint);
  std::string dir_arg, json_path, suite;
  po::options_description desc("strata-bench --suite checkpoint");
  desc.add_options()("suite", po::value(&suite))("presets", po::value(&presets)->default_value(presets))(
      "dir", po::value(&dir_arg), "where checkpoints are written (default: a temp dir, removed)")(
      "json", po::value(&json_path), "write the per-rank results as JSON lines to FILE");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "error: " << e.what() << " (--suite checkpoint takes --presets, --dir, --json)" << std::endl;
    return 2;
  }
  if (auto env = dist_env_from(current_environment())) {
    const char* preset = std::getenv("STRATA_CHECKPOINT_BENCH_PRESET");
    const char* dir = std::getenv("STRATA_CHECKPOINT_BENCH_DIR");
    TORCH_CHECK(preset != nullptr && dir != nullptr, "strata-bench --suite checkpoint: a rank was started without "
                "STRATA_CHECKPOINT_BENCH_PRESET / _DIR (run it without a launcher: it launches its own ranks)");
    return run_worker(*env, models, preset, dir);
  }
  std::vector<std::string> preset_names;
  std::stringstream preset_list(presets);
  for (std::string preset; std::getline(preset_list, preset, ',');) preset_names.push_back(preset);
  TORCH_CHECK_VALUE(!preset_names.empty(), "--presets is empty; name one or more presets");
  check_suite_input(preset_names, models, dir_arg, json_path);
  const bool temp = dir_arg.empty();
  const fs::path dir = temp ? fs::temp_directory_path() / ("strata-ckpt-bench-" + std::to_string(::getpid())) : fs::path(dir_arg);
  fs::create_directories(dir);
  double disk = 0;
  std::ostringstream table;
  table << std::fixed << table_header(dir, disk);
  std::ofstream json_out;
  if (!json_path.empty()) json_out.open(json_path);
  for (const std::string& preset : preset_names) {
    ::setenv("STRATA_CHECKPOINT_BENCH_PRESET", preset.c_str(), 1);
    ::setenv("STRATA_CHECKPOINT_BENCH_DIR", dir.c_str(), 1);
    LaunchOptions launch;
    launch.nproc = kRanks;
    launch.threads_per_rank = 1;
    std::vector<std::string> args(argv, argv + argc);
    args[0] = self_executable(argv[0]);
    const auto start = Clock::now();
    const int rc = launch_ranks(args, launch);
    std::cerr << "checkpoint bench " << preset << ": ranks finished in " << seconds_since(start) << " s (rc " << rc << ")\n";
    if (rc != 0) return 1;
    std::vector<json> ranks;
    for (int r = 0; r < kRanks; ++r) {
      std::ifstream in(dir / ("rank-" + std::to_string(r) + "-" + preset + ".json"));
      ranks.push_back(json::parse(in));
      if (json_out.is_open()) json_out << ranks.back().dump() << "\n";
    }
    append_rows(table, preset, ranks, disk);
  }
  std::cout << table.str();
  if (temp) fs::remove_all(dir);
  return 0;
}

int run_checkpoint_suite(int argc, char** argv, const recipes::ModelRegistry& models) {
  return exit_code_of([&] { return checkpoint_suite(argc, argv, models); });
}

}  // namespace strata::bench
