// fsdp_offload_test - FSDP with the sharded state offloaded (--offload):
// the tier and its I/O queue, training with disk offload against training
// without it (thread ranks), and through strata-gpt: memory lowered, files
// gone after success, failure and signals, bad input refused.
#include "strata/core/cuda_support.h"
#include "strata/strategies/fsdp/offload.h"
#include "strata/strategies/offload_tier.h"
#include "tests/strategies/fsdp/fsdp_harness.h"
#include "tests/process.h"
#include "tests/run_binary.h"
#include "tests/error_text.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <sstream>

namespace {
namespace fs = std::filesystem;
using namespace strata::testing;
using strata::FSDPOptions;
using strata::OffloadKind;
using strata::ShardingStrategy;

/// Entries in `dir` (the disk tier's file is unnamed: none should ever show).
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// Open descriptors of `pid` pointing at deleted files inside `dir`.
int deleted_files_open_in(pid_t pid, const fs::path& dir) {
  int n = 0;
  std::error_code ec;
  const std::string prefix = fs::canonical(dir).string() + "/";
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    const auto target = fs::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind(prefix, 0) == 0 && target.find("(deleted)") != std::string::npos) ++n;
  }
  return n;
}

/// The processes that hold a deleted file of `dir` open.
std::vector<pid_t> processes_holding_files_in(const fs::path& dir) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const auto name = e.path().filename().string();
    if (!std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    if (deleted_files_open_in(std::stoi(name), dir) > 0) out.push_back(std::stoi(name));
  }
  return out;
}

// ---- the tier --------------------------------------------------------------

TEST(OffloadTierTest, DiskTierRoundTripsRegionsInAnUnnamedFile) {
  TempDir dir("strata-tier");
  auto tier = strata::make_disk_tier(dir.path().string());
  const auto a = tier->allocate(400);
  const auto b = tier->allocate(4000);
  EXPECT_EQ(tier->bytes(), 4400);
  // Nothing visible in the directory, but the file is open (and deleted).
  EXPECT_TRUE(entries(dir.path()).empty());
  EXPECT_EQ(deleted_files_open_in(::getpid(), dir.path()), 1);
  auto zeros = torch::ones({100});
  tier->read(a, 0, zeros);
  EXPECT_TRUE(torch::equal(zeros, torch::zeros({100}))) << "a fresh region reads as zeros";
  const auto values = torch::arange(1000, torch::kFloat32);
  tier->write(b, 0, values);
  tier->write(a, 0, values.narrow(0, 900, 100).contiguous());
  auto back = torch::empty({250});
  tier->read(b, 1000, back);  // byte 1000 = element 250
  EXPECT_TRUE(torch::equal(back, values.narrow(0, 250, 250)));
  tier->read(a, 0, zeros);
  EXPECT_TRUE(torch::equal(zeros, values.narrow(0, 900, 100)));
  const auto stats = tier->stats();
  EXPECT_EQ(stats.bytes_written, 4400);
  EXPECT_EQ(stats.bytes_read, 400 + 1000 + 400);
  tier.reset();
  EXPECT_EQ(deleted_files_open_in(::getpid(), dir.path()), 0) << "closing the tier releases the file";
}

TEST(OffloadTierTest, OutOfRangeAccessAndBadDirectoriesAreErrorsNamingThem) {
  TempDir dir("strata-tier");
  auto tier = strata::make_disk_tier(dir.path().string());
  const auto a = tier->allocate(16);
  auto big = torch::empty({5});
  EXPECT_CONTAINS(what_of([&] { tier->read(a, 0, big); }), "bytes [0, 20) outside region 0 of 16 bytes");
  EXPECT_CONTAINS(what_of([&] { strata::make_disk_tier("/nonexistent/strata"); }),
                  "cannot use --offload-dir '/nonexistent/strata': No such file or directory");
  const auto file = dir.path() / "plain";
  std::ofstream(file) << "x";
  EXPECT_CONTAINS(what_of([&] { strata::make_disk_tier(file.string()); }), "not a directory");
  // Far more than any disk: the reservation fails at allocate(), naming the directory.
  EXPECT_CONTAINS(what_of([&] { tier->allocate(int64_t{1} << 55); }),
                  "cannot use --offload-dir '" + dir.path().string() + "': reserving");
}

TEST(OffloadTierTest, HostTierNeedsCuda) {
  if (strata::built_with_cuda()) GTEST_SKIP() << "this LibTorch has CUDA: the host tier is usable";
  EXPECT_CONTAINS(what_of([] { strata::make_host_tier(); }), "use --offload disk");
}

TEST(IoQueueTest, RunsTasksInOrderAndPassesErrorsOn) {
  strata::IoQueue queue;
  std::vector<int> order;
  std::vector<std::future<void>> done;
  for (int i = 0; i < 20; ++i) done.push_back(queue.submit([&order, i] { order.push_back(i); }));
  auto failing = queue.submit([] { throw std::runtime_error("disk on fire"); });
  for (auto& f : done) f.get();
  std::vector<int> expected(20);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected);
  EXPECT_THROW(failing.get(), std::runtime_error);
}

// ---- training with offload equals training without --------------------------

struct OffloadCase {
  int world = 2;
  int64_t accum = 1;
  double clip = 0.0;
  bool tie = true;
  std::string optimizer = "adamw";
  ShardingStrategy sharding = ShardingStrategy::kFullShard;
  int node_size = 0;
  int64_t chunk = int64_t{1} << 20;
};

void expect_offload_changes_nothing(const OffloadCase& c) {
  SCOPED_TRACE("world=" + std::to_string(c.world) + " accum=" + std::to_string(c.accum) + " clip=" +
               std::to_string(c.clip) + " tie=" + std::to_string(c.tie) + " " + c.optimizer + " " +
               strata::to_string(c.sharding) + " chunk=" + std::to_string(c.chunk));
  TempDir dir("strata-offload");
  const auto options = fsdp_test_options(2, c.accum, c.clip, 6).optimizer(c.optimizer).lr(1e-2);
  FsdpRun plain;
  plain.world = c.world;
  plain.options.sharding_strategy(c.sharding).node_size(c.node_size);
  const auto reference = train_fsdp(gpt_nano(c.tie), options, plain);
  FsdpRun offloaded = plain;
  offloaded.options.offload(OffloadKind::kDisk).offload_dir(dir.path().string()).offload_chunk_numel(c.chunk);
  const auto got = train_fsdp(gpt_nano(c.tie), options, offloaded);
  // The same operations on the same values: equal up to how a vectorised
  // kernel treats a slice's first and last elements.
  EXPECT_LE(max_param_diff(reference[0].params, got[0].params), 1e-6);
  ASSERT_EQ(reference[0].grad_norms.size(), got[0].grad_norms.size());
  for (size_t s = 0; s < reference[0].grad_norms.size(); ++s) {
    EXPECT_NEAR(got[0].grad_norms[s], reference[0].grad_norms[s], 1e-6 * reference[0].grad_norms[s])
        << "step " << s + 1;
  }
  // Between steps nothing of the model state is resident; all of it is in the tier.
  const auto& resident = got[0].result.model_state_bytes[0];
  EXPECT_EQ(resident.params + resident.grads + resident.optimizer, 0);
  EXPECT_TRUE(entries(dir.path()).empty());
}

TEST(FsdpOffloadTest, DiskOffloadGivesTheSameParametersAsNoOffload) {
  expect_offload_changes_nothing({});
  OffloadCase three;
  three.world = 3;
  three.accum = 2;
  three.clip = 0.05;  // clips every step here: the deferred scale is exercised
  expect_offload_changes_nothing(three);
}

TEST(FsdpOffloadTest, SmallChunksUntiedSgdAndHybridShardMatchToo) {
  OffloadCase small;  // many chunks per unit, pieces split across chunks
  small.chunk = 7;
  small.tie = false;
  small.clip = 0.05;
  expect_offload_changes_nothing(small);
  OffloadCase sgd;
  sgd.optimizer = "sgd";
  sgd.world = 3;
  expect_offload_changes_nothing(sgd);
  OffloadCase hybrid;
  hybrid.world = 4;
  hybrid.sharding = ShardingStrategy::kHybridShard;
  hybrid.node_size = 2;
  hybrid.accum = 2;
  expect_offload_changes_nothing(hybrid);
}

TEST(FsdpOffloadTest, OffloadedStateIsCountedAndGoesThroughTheTier) {
  TempDir dir("strata-offload");
  FsdpRun run;
  run.options.offload(OffloadKind::kDisk).offload_dir(dir.path().string());
  std::vector<std::map<std::string, double>> reports(2);
  std::vector<int64_t> shard_bytes(2, 0);
  std::mutex mu;
  // Each rank's report at the end of fit: bytes in the tier = 4 x its shards
  // (params, grads, AdamW's two moments), and every step went through it.
  class Report : public strata::Callback {
   public:
    Report(std::vector<std::map<std::string, double>>& out, std::mutex& mu) : out_(out), mu_(mu) {}
    std::string name() const override { return "Report"; }
    void on_fit_end(strata::Trainer& trainer, strata::TrainingModule&) override {
      std::lock_guard<std::mutex> lock(mu_);
      out_[trainer.strategy().rank()] = trainer.strategy().report();
    }

   private:
    std::vector<std::map<std::string, double>>& out_;
    std::mutex& mu_;
  };
  run.callbacks = [&](int) {
    return std::vector<std::shared_ptr<strata::Callback>>{std::make_shared<Report>(reports, mu)};
  };
  train_fsdp(gpt_nano(), fsdp_test_options(2, 1, 0.0, 3), run);
  // gpt-nano (vocab 16, block 8, no biases, tied): the units' padded shards.
  auto module = gpt_nano()();
  int64_t total = 0;
  for (const auto& p : module->module().parameters()) total += p.numel();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(reports[r].count("offload_bytes"), 1u);
    const double bytes = reports[r]["offload_bytes"];
    // 4 fp32 copies of a half of the model, plus at most one padding element per unit (3 blocks + root).
    EXPECT_GE(bytes, 4.0 * 4.0 * static_cast<double>(total) / 2);
    EXPECT_LE(bytes, 4.0 * 4.0 * (static_cast<double>(total) / 2 + 4));
    // Each step reads every shard for the forward and backward gathers and
    // the step, and writes params, moments and gradients back.
    EXPECT_GE(reports[r]["offload_write_bytes"], 3 * bytes);
    EXPECT_GE(reports[r]["offload_read_bytes"], 3 * bytes);
  }
}

// ---- through strata-gpt ----------------------------------------------------

nlohmann::json summary_of(const fs::path& dir) {
  std::ifstream in(dir / "summary.json");
  return nlohmann::json::parse(in);
}

// Peak RSS moves by a few MB between identical runs (allocator arenas, the
// I/O thread's stack, page granularity): measured 80-87 MB drops for an
// 85 MB offload over repeated ddp runs on a ~585 MB process. Tensor bytes are
// exact; RSS comparisons get this much slack on top, 2% of the larger run's
// peak -- far less than any offload that failed to free what it moved.
double rss_noise(const nlohmann::json& baseline, int rank) {
  return 0.02 * baseline["peak_rss_bytes"][rank].get<double>();
}

TEST(FsdpOffloadBinaryTest, DiskOffloadLowersPeakTensorBytesAndRssByTheOffloadedStateLessStaging) {
  TempDir dir("strata-offload");
  // Wide enough that the model state (16 bytes x 10.7M parameters / 2 ranks,
  // ~85 MB per rank) dwarfs activations and staging.
  const std::string common =
      "--preset gpt-mini --n-embd 384 --strategy fsdp --nproc 2 --max-steps 3 --batch-size 2 "
      "--limit-val-batches 0 --log-every-n-steps 1 ";
  const auto none = run_gpt_binary(common + "--output-dir " + (dir.path() / "none").string());
  ASSERT_EQ(none.exit_code, 0) << none.output;
  const auto disk = run_gpt_binary(common + "--offload disk --output-dir " + (dir.path() / "disk").string());
  ASSERT_EQ(disk.exit_code, 0) << disk.output;
  EXPECT_CONTAINS(disk.output, "offload disk: shards, their gradients and optimizer state in disk");
  const auto a = summary_of(dir.path() / "none");
  const auto b = summary_of(dir.path() / "disk");
  ASSERT_TRUE(b.contains("offload_bytes")) << b.dump();
  const double offloaded = b["offload_bytes"].get<double>();
  // What offload adds back: the step's staging buffers (bounded, reported),
  // and while gathering or reducing a unit, up to two shard-sized host copies
  // (a shard read for the all-gather, a gradient read for accumulation).
  const double c = 384, block_shard_bytes = 4 * (12 * c * c + 13 * c) / 2;
  const double allowance = b["offload_staging_bytes"].get<double>() + 2 * block_shard_bytes;
  EXPECT_LT(allowance, 0.25 * offloaded) << "the test's model is too small to show the difference";
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const auto& state = a["model_state_bytes"][r];
    const double state_bytes = state["params"].get<double>() + state["grads"].get<double>() +
                               state["optimizer"].get<double>();
    EXPECT_NEAR(offloaded, state_bytes, 0.01 * state_bytes) << "the tier holds what memory held";
    const double tensor_drop = a["peak_tensor_bytes"][r].get<double>() - b["peak_tensor_bytes"][r].get<double>();
    const double rss_drop = a["peak_rss_bytes"][r].get<double>() - b["peak_rss_bytes"][r].get<double>();
    EXPECT_GE(tensor_drop, offloaded - allowance) << "peak tensor bytes " << a["peak_tensor_bytes"][r] << " -> "
                                                  << b["peak_tensor_bytes"][r] << ", offloaded " << offloaded;
    EXPECT_GE(rss_drop, offloaded - allowance - rss_noise(a, r)) << "peak RSS " << a["peak_rss_bytes"][r] << " -> "
                                               << b["peak_rss_bytes"][r] << ", offloaded " << offloaded;
  }
  // The same training: losses as printed.
  EXPECT_EQ(losses_of(dir.path() / "none" / "metrics.csv"), losses_of(dir.path() / "disk" / "metrics.csv"));
  EXPECT_EQ(entries(dir.path() / "disk"), (std::vector<std::string>{"config.ini", "metrics.csv", "summary.json"}))
      << "only the run's outputs stay in the output (and offload) directory";
}

TEST(FsdpOffloadBinaryTest, DiskOffloadCheckpointsResumeAtAnotherWorldSizeAndRssStaysFlatWhileSaving) {
  // The offloaded state is streamed to the checkpoint chunk by chunk: a run
  // that saves peaks no higher than one that does not (no copy of the
  // ~85 MB per rank it offloads comes back into memory), and a resume at 4
  // ranks (same global batch) continues to the same losses.
  TempDir dir("strata-offload-ckpt");
  const std::string common =
      "--preset gpt-mini --n-embd 384 --strategy fsdp --offload disk --dropout 0 --max-steps 6 --warmup-steps 1 "
      "--limit-val-batches 0 --log-every-n-steps 1 --threads-per-rank 1 ";
  const fs::path plain = dir.path() / "plain", saving = dir.path() / "saving";
  auto run = run_gpt_binary(common + "--nproc 2 --batch-size 2 --output-dir " + plain.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (const std::string format : {"full", "sharded"}) {
    SCOPED_TRACE(format);
    fs::remove_all(saving);
    run = run_gpt_binary(common + "--nproc 2 --batch-size 2 --checkpoint-every 3 --checkpoint-keep 0 "
                         "--checkpoint-format " + format + " --output-dir " + saving.string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(losses_of(plain / "metrics.csv"), losses_of(saving / "metrics.csv"));
    const auto a = summary_of(plain), b = summary_of(saving);
    const double offloaded = b["offload_bytes"].get<double>();
    for (int r = 0; r < 2; ++r) {
      const double grew = b["peak_rss_bytes"][r].get<double>() - a["peak_rss_bytes"][r].get<double>();
      std::cout << "[ offload checkpoint ] " << format << " rank " << r << ": peak RSS " << a["peak_rss_bytes"][r]
                << " -> " << b["peak_rss_bytes"][r] << " B while saving; offloaded " << offloaded << " B" << std::endl;
      EXPECT_LT(grew, 0.25 * offloaded + rss_noise(a, r))
          << "rank " << r << ": saving raised peak RSS by " << grew << " B; offloaded " << offloaded << " B";
    }
    // Resumed at 4 ranks x 1 sample (the same global batch) from step 3.
    const fs::path resumed = dir.path() / ("resumed-" + format);
    run = run_gpt_binary(common + "--nproc 4 --batch-size 1 --resume " + (saving / "checkpoints" / "step-3").string() +
                         " --output-dir " + resumed.string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const auto want = losses_of(plain / "metrics.csv"), got = losses_of(resumed / "metrics.csv");
    ASSERT_EQ(want.size(), 6u);
    ASSERT_EQ(got.size(), 3u);  // steps 4-6: a fresh output directory
    auto loss = [](const std::string& row) {  // "step loss val_loss "
      std::istringstream in(row);
      std::string step;
      double value = 0.0;
      in >> step >> value;
      return value;
    };
    for (size_t s = 0; s < 3; ++s) {
      EXPECT_EQ(got[s].substr(0, 2), want[s + 3].substr(0, 2)) << "the same step";
      EXPECT_NEAR(loss(got[s]), loss(want[s + 3]), 1e-4) << got[s] << " vs " << want[s + 3];
    }
  }
}

TEST(FsdpOffloadBinaryTest, DdpOptimizerStateOffloadLowersPeakTensorBytesAndRss) {
  // ddp keeps parameters and gradients whole on every rank; --offload disk
  // moves AdamW's two moments (8 bytes per parameter) out of memory.
  TempDir dir("strata-offload");
  const std::string common =
      "--preset gpt-mini --n-embd 384 --strategy ddp --nproc 2 --max-steps 3 --batch-size 2 "
      "--limit-val-batches 0 --log-every-n-steps 1 ";
  const auto none = run_gpt_binary(common + "--output-dir " + (dir.path() / "none").string());
  ASSERT_EQ(none.exit_code, 0) << none.output;
  const auto disk = run_gpt_binary(common + "--offload disk --output-dir " + (dir.path() / "disk").string());
  ASSERT_EQ(disk.exit_code, 0) << disk.output;
  const auto a = summary_of(dir.path() / "none");
  const auto b = summary_of(dir.path() / "disk");
  ASSERT_TRUE(b.contains("offload_bytes")) << b.dump();
  const double offloaded = b["offload_bytes"].get<double>();
  // Staging: two sets of both moments of one chunk (the default chunk).
  const double staging = 2 * 2 * 4 * static_cast<double>(strata::kDefaultOffloadChunkNumel);
  EXPECT_LT(staging, 0.1 * offloaded) << "the test's model is too small to show the difference";
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const double resident = a["model_state_bytes"][r]["optimizer"].get<double>();
    EXPECT_DOUBLE_EQ(offloaded, resident) << "the tier holds what memory held";
    EXPECT_EQ(b["model_state_bytes"][r]["optimizer"].get<double>(), 0.0);
    const double tensor_drop = a["peak_tensor_bytes"][r].get<double>() - b["peak_tensor_bytes"][r].get<double>();
    const double rss_drop = a["peak_rss_bytes"][r].get<double>() - b["peak_rss_bytes"][r].get<double>();
    EXPECT_GE(tensor_drop, offloaded - staging) << "peak tensor bytes " << a["peak_tensor_bytes"][r] << " -> "
                                                << b["peak_tensor_bytes"][r] << ", offloaded " << offloaded;
    EXPECT_GE(rss_drop, offloaded - staging - rss_noise(a, r)) << "peak RSS " << a["peak_rss_bytes"][r] << " -> "
                                             << b["peak_rss_bytes"][r] << ", offloaded " << offloaded;
  }
  EXPECT_EQ(losses_of(dir.path() / "none" / "metrics.csv"), losses_of(dir.path() / "disk" / "metrics.csv"));
  EXPECT_EQ(entries(dir.path() / "disk"), (std::vector<std::string>{"config.ini", "metrics.csv", "summary.json"}));
}

TEST(FsdpOffloadBinaryTest, NoOffloadFileOutlivesAFailedOrSignalledRun) {
  TempDir dir("strata-offload");
  const auto offload_dir = dir.path() / "offload";
  fs::create_directories(offload_dir);
  const std::string common = "--preset gpt-nano --strategy fsdp --nproc 2 --offload disk --offload-dir " +
                             offload_dir.string() + " --limit-val-batches 0 ";
  // A rank fails mid-run.
  const auto failed = run_gpt_binary(common + "--max-steps 20 --output-dir " + (dir.path() / "failed").string(),
                                     "STRATA_TEST_FAIL_AT_STEP=5 STRATA_TEST_FAIL_RANK=1");
  EXPECT_NE(failed.exit_code, 0) << failed.output;
  EXPECT_CONTAINS(failed.output, "injected failure at step 5");
  EXPECT_TRUE(entries(offload_dir).empty());
  // Signals while the ranks train (and hold their files): SIGTERM and SIGINT
  // to the launcher (it stops its ranks), SIGKILL to the launcher (the ranks'
  // parent-death signal stops them) and SIGKILL to one rank (the launcher
  // stops the rest). An unnamed file dies with its last descriptor.
  struct Kill {
    int sig;
    bool rank;  ///< to a rank instead of the launcher
  };
  for (const Kill kill : {Kill{SIGTERM, false}, Kill{SIGINT, false}, Kill{SIGKILL, false}, Kill{SIGKILL, true}}) {
    const std::string tag = std::to_string(kill.sig) + (kill.rank ? "-rank" : "");
    SCOPED_TRACE(std::string(strsignal(kill.sig)) + (kill.rank ? " to rank" : " to the launcher"));
    const auto out = dir.path() / ("signalled-" + tag);
    std::vector<std::string> argv = {STRATA_GPT_BINARY};
    std::istringstream words(common + "--max-steps 100000 --log-every-n-steps 1 --output-dir " + out.string());
    for (std::string w; words >> w;) argv.push_back(w);
    Process run(argv, base_environment(), dir.path() / ("log-" + tag));
    ASSERT_TRUE(run.started());
    ASSERT_TRUE(wait_until([&] { return losses_of(out / "metrics.csv").size() >= 2; }, std::chrono::seconds(60)))
        << run.output();
    // While training, each rank holds an unnamed file there: nothing to see.
    const auto holders = processes_holding_files_in(offload_dir);
    EXPECT_EQ(holders.size(), 2u) << "one offload file per rank";
    EXPECT_TRUE(entries(offload_dir).empty());
    ASSERT_FALSE(holders.empty());
    ::kill(kill.rank ? holders.front() : run.pid(), kill.sig);
    const auto code = run.wait_for(std::chrono::seconds(60));
    ASSERT_TRUE(code.has_value()) << "the launcher did not stop";
    if (kill.sig != SIGKILL || kill.rank) {
      EXPECT_NE(*code, 0);
    }
    EXPECT_TRUE(wait_until([&] { return processes_holding_files_in(offload_dir).empty(); }, std::chrono::seconds(30)))
        << "a rank outlived the run";
    EXPECT_TRUE(entries(offload_dir).empty());
  }
}

TEST(FsdpOffloadBinaryTest, WithoutOTmpfileANameAKillLeftBehindIsRemovedByTheNextRun) {
  // The fallback for filesystems without O_TMPFILE names the file for the
  // microseconds between mkostemp() and unlink(); a kill in that window
  // leaves ".strata-offload-<pid>-XXXXXX", which the next run removes once
  // that pid is gone. Other names stay.
  TempDir dir("strata-offload");
  const auto offload_dir = dir.path() / "offload";
  fs::create_directories(offload_dir);
  const std::string dead = ".strata-offload-999999999-aaaaaa";  // above any pid_max (2^22)
  const std::string live = ".strata-offload-" + std::to_string(::getpid()) + "-bbbbbb";
  for (const auto& name : {dead, live, std::string("notes.txt")}) std::ofstream(offload_dir / name) << "x";
  const auto run = run_gpt_binary("--preset gpt-nano --strategy fsdp --nproc 2 --offload disk --offload-dir " +
                                      offload_dir.string() + " --max-steps 3 --limit-val-batches 0 --output-dir " +
                                      (dir.path() / "out").string(),
                                  "STRATA_TEST_OFFLOAD_NO_TMPFILE=1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(entries(offload_dir), (std::vector<std::string>{live, "notes.txt"}));
}

TEST(FsdpOffloadBinaryTest, BadOffloadInputIsAOneLineErrorAndExitTwo) {
  TempDir dir("strata-offload");
  const std::string out = " --output-dir " + (dir.path() / "out").string();
  struct Bad {
    std::string args, message;
  };
  const std::vector<Bad> cases = {
      {"--strategy fsdp --nproc 2 --offload cpu --device cpu",
       "--offload cpu moves state off a CUDA device into pinned host memory, but the device is cpu"},
      {"--strategy fsdp --nproc 2 --offload tape", "unknown offload 'tape'; available: none, cpu, disk"},
      {"--strategy fsdp --nproc 2 --offload disk --offload-dir /nonexistent/strata",
       "cannot use --offload-dir '/nonexistent/strata': No such file or directory"},
      {"--strategy fsdp --nproc 2 --offload-dir /tmp", "--offload-dir applies only with --offload disk"},
      {"--strategy ddp --nproc 2 --offload cpu --device cpu",
       "--offload cpu moves state off a CUDA device into pinned host memory, but the device is cpu"},
      {"--strategy sdp --nproc 2 --offload disk --offload-dir /nonexistent/strata",
       "cannot use --offload-dir '/nonexistent/strata': No such file or directory"},
      {"--strategy fsdp --nproc 2 --offload disk --sharding-strategy no_shard",
       "--offload disk needs sharded parameters; --sharding-strategy no_shard"},
      {"--strategy fsdp --offload disk", "needs sharded parameters: at least 2 ranks per shard group (got 1)"},
      {"--strategy fsdp --nproc 2 --offload disk --checkpoint-every 5 --checkpoint-async",
       "--checkpoint-async cannot be combined with --offload disk"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const auto run = run_gpt_binary("--preset gpt-nano --max-steps 2 " + c.args + out);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_CONTAINS(run.output, c.message);
    EXPECT_FALSE(fs::exists(dir.path() / "out" / "config.ini")) << "nothing written";
  }
}

TEST(FsdpOffloadBinaryTest, OffloadDirectoryWithoutSpaceIsRefusedBeforeTraining) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  if (std::system("command -v unshare >/dev/null 2>&1") != 0) GTEST_SKIP() << "unshare (util-linux) is missing";
  TempDir dir("strata-offload");
  const auto small = dir.path() / "small";
  fs::create_directories(small);
  // A private mount namespace: the 64 KiB tmpfs exists only for this command.
  const std::string command = "unshare --mount sh -c 'mount -t tmpfs -o size=64k tmpfs " + small.string() + " && " +
                              STRATA_GPT_BINARY + " --preset gpt-nano --strategy fsdp --nproc 2 --max-steps 2 "
                              "--offload disk --offload-dir " + small.string() + " --output-dir " +
                              (dir.path() / "out").string() + "' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), pipe) != nullptr) output += buf.data();
  const int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status)) << output;
  if (output.find("mount:") != std::string::npos) GTEST_SKIP() << "cannot mount tmpfs here: " << output;
  EXPECT_EQ(WEXITSTATUS(status), 2) << output;
  EXPECT_CONTAINS(output, "cannot use --offload-dir '" + small.string() + "': it has ");
  EXPECT_CONTAINS(output, "but the offloaded state of 2 rank(s) needs");
  EXPECT_FALSE(fs::exists(dir.path() / "out" / "config.ini"));
}

}  // namespace
