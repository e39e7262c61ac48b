// checkpoint_test - the checkpoint format (trainer/checkpoint.h) across
// strategies and world sizes on thread-ranks: save under one configuration,
// load under another, continue, compare with continuing in the original one.
// Faults: corrupt files, a different model or optimizer, and a rank killed
// mid-save (real processes through strata-gpt).
#include "strata/callbacks/model_checkpoint.h"
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/strategies/fsdp/fully_sharded.h"
#include "strata/strategies/registry.h"
#include "strata/strategies/thread_world.h"
#include "tests/run_binary.h"
#include "tests/toy_data.h"
#include "strata/trainer/checkpoint.h"
#include "strata/trainer/checkpoint_format.h"
#include "strata/trainer/trainer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>

namespace {
namespace fs = std::filesystem;
using strata::recipes::GPTModule;

struct Config {
  std::string strategy;
  int world;
  std::string offload = "none";  ///< disk: fsdp's shards and moments, the others' moments, in a file
};

std::string label(const Config& c) {
  return c.strategy + "x" + std::to_string(c.world) + (c.offload == "none" ? "" : "+offload-" + c.offload);
}

constexpr int64_t kGlobalBatch = 12;  // divisible by every world size below
constexpr int64_t kSaveStep = 3;
constexpr int64_t kSteps = 8;         // kSaveStep + 5 continued steps

std::unique_ptr<GPTModule> make_module(uint64_t seed, int64_t n_layer) {
  // Thread-ranks share torch's default generator: build under a lock.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  torch::manual_seed(seed);
  // No Linear biases, dropout off: see strategy_threads_test.
  return std::make_unique<GPTModule>(
      strata::recipes::gpt_preset("gpt-nano").vocab_size(16).block_size(8).bias(false).n_layer(n_layer).dropout(0.0));
}

strata::TrainerOptions options_for(const Config& c) {
  // lr 1e-4: see parity_test (Adam turns summation-order noise into ~lr steps).
  return strata::TrainerOptions().max_steps(kSteps).batch_size(kGlobalBatch / c.world).lr(1e-4).min_lr(1e-5)
      .warmup_steps(2).limit_val_batches(0).gradient_clip_val(1.0);
}

/// At `step`: saves one checkpoint per (dir, format), then stops.
class SaveAndStop : public strata::Callback {
 public:
  SaveAndStop(int64_t step, std::vector<std::pair<std::string, std::string>> saves)
      : step_(step), saves_(std::move(saves)) {}
  std::string name() const override { return "SaveAndStop"; }
  void on_train_batch_end(strata::Trainer& t, strata::TrainingModule&, const strata::StepMetrics& m) override {
    if (m.step != step_) return;
    for (const auto& [dir, format] : saves_) t.save_checkpoint(dir, format);
    t.request_stop("saved");
  }

 private:
  int64_t step_;
  std::vector<std::pair<std::string, std::string>> saves_;
};

/// After a resume: drops the optimizer state (as if only parameters were loaded).
class DropOptimizerState : public strata::Callback {
 public:
  std::string name() const override { return "DropOptimizerState"; }
  void on_fit_start(strata::Trainer& t, strata::TrainingModule&) override { t.optimizer()->state().clear(); }
};

/// Trains `c` on thread-ranks; returns rank 0's full parameters at the end.
std::vector<torch::Tensor> run(const Config& c, uint64_t seed, const std::string& resume,
                               std::vector<std::pair<std::string, std::string>> saves = {}, int64_t n_layer = 2,
                               const std::string& optimizer = "adamw", bool drop_optimizer_state = false,
                               double momentum = 0.0, double lr = 1e-4) {
  std::vector<std::unique_ptr<GPTModule>> modules;
  for (int r = 0; r < c.world; ++r) modules.push_back(make_module(seed, n_layer));
  std::vector<torch::Tensor> out;
  strata::StrategyRegistry registry;
  strata::register_builtin_strategies(registry);
  strata::run_thread_world(c.world, [&](strata::Comm& comm) {
    strata::StrategyContext context;
    context.world_size = comm.size();
    context.offload = c.offload;
    if (c.offload == "disk") context.offload_dir = fs::temp_directory_path().string();
    std::shared_ptr<strata::Strategy> strategy = registry.create(c.strategy, comm, {}, context);
    std::vector<std::shared_ptr<strata::Callback>> callbacks;
    if (!saves.empty()) callbacks.push_back(std::make_shared<SaveAndStop>(kSaveStep, saves));
    if (drop_optimizer_state) callbacks.push_back(std::make_shared<DropOptimizerState>());
    strata::testing::ToyData data;
    auto& module = *modules[comm.rank()];
    strata::Trainer(
        options_for(c).resume_from(resume).optimizer(optimizer).momentum(momentum).nesterov(momentum > 0).lr(lr),
                    strategy, callbacks)
        .fit(module, data);
    auto full = strategy->full_params();
    if (comm.rank() == 0) {
      for (const auto& p : module.module().parameters()) out.push_back(p.detach().clone());
    }
  }, std::chrono::seconds(60));
  return out;
}

double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i].sizes() != b[i].sizes()) return 1e30;
    const double d = (a[i] - b[i]).abs().max().item<double>();
    if (std::isnan(d)) return 1e30;  // std::max would drop a NaN (a run that diverged) and report 0
    worst = std::max(worst, d);
  }
  return worst;
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("strata-ckpt-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

TEST(CheckpointReshardTest, AnyStrategyAndWorldSizeLoadsAnyOther) {
  // Source -> (target for the full checkpoint, target for the sharded one).
  const std::vector<std::tuple<Config, Config, Config>> matrix = {
      {{"single", 1}, {"fsdp", 4}, {"oss", 2}},
      {{"ddp", 2}, {"sdp", 3}, {"fsdp", 4}},
      {{"oss", 2}, {"single", 1}, {"sdp", 3}},
      {{"sdp", 3}, {"fsdp", 4}, {"ddp", 2}},
      {{"fsdp", 4}, {"ddp", 2}, {"single", 1}},
  };
  TempDir tmp;
  bool first = true;
  for (const auto& [source, to_full, to_sharded] : matrix) {
    const auto full_dir = (tmp.path / (label(source) + "-full")).string();
    const auto sharded_dir = (tmp.path / (label(source) + "-sharded")).string();
    run(source, 11, "", {{full_dir, "full"}, {sharded_dir, "sharded"}});
    ASSERT_TRUE(fs::exists(fs::path(full_dir) / "full.bin")) << label(source);
    ASSERT_TRUE(fs::exists(fs::path(sharded_dir) / ("shard-0-of-" + std::to_string(source.world) + ".bin")));
    EXPECT_EQ(strata::read_checkpoint_meta(full_dir).step, kSaveStep);
    // The reference: continuing in the original configuration. Different
    // init seeds below: every value must come from the checkpoint.
    const auto reference = run(source, 99, sharded_dir);
    const auto from_full = run(to_full, 98, full_dir);
    const auto from_sharded = run(to_sharded, 97, sharded_dir);
    const auto fresh = run(source, 11, "");  // uninterrupted: resume is exact
    std::cout << label(source) << ": max |diff| resumed/uninterrupted " << max_diff(reference, fresh) << ", full -> "
              << label(to_full) << " " << max_diff(reference, from_full) << ", sharded -> " << label(to_sharded) << " "
              << max_diff(reference, from_sharded) << std::endl;
    EXPECT_LE(max_diff(reference, fresh), 1e-5) << label(source) << " resumed vs uninterrupted";
    EXPECT_LE(max_diff(reference, from_full), 1e-5) << label(source) << " full -> " << label(to_full);
    EXPECT_LE(max_diff(reference, from_sharded), 1e-5) << label(source) << " sharded -> " << label(to_sharded);
    if (first) {
      // The tolerance discriminates: five steps from the step-3 parameters
      // with fresh (zero) AdamW state land elsewhere.
      const auto fresh_state = run(source, 99, sharded_dir, {}, 2, "adamw", /*drop_optimizer_state=*/true);
      EXPECT_GT(max_diff(reference, fresh_state), 1e-4) << label(source);
      first = false;
    }
  }
}

TEST(CheckpointReshardTest, SgdMomentumResumesExactlyAndAcrossStrategies) {
  // SGD with Nesterov momentum: its momentum buffers are optimizer state like
  // AdamW's moments, saved by their owners and loaded by any layout.
  TempDir tmp;
  const Config source{"sdp", 2}, target{"fsdp", 3};
  const auto dir = (tmp.path / "sdp-sharded").string();
  const auto run_sgd = [&](const Config& c, uint64_t seed, const std::string& resume,
                           std::vector<std::pair<std::string, std::string>> saves = {}, bool drop = false) {
    // lr 0.1: a step of SGD (clipped to norm 1) moves weights far enough for
    // dropped momentum buffers to show.
    return run(c, seed, resume, std::move(saves), 2, "sgd", drop, /*momentum=*/0.9, /*lr=*/0.1);
  };
  run_sgd(source, 11, "", {{dir, "sharded"}});
  const auto fresh = run_sgd(source, 11, "");
  const auto resumed = run_sgd(source, 99, dir);
  const auto moved = run_sgd(target, 98, dir);
  const auto without_momentum = run_sgd(source, 99, dir, {}, /*drop=*/true);
  std::cout << "sgd+nesterov sdp x2: resumed/uninterrupted " << max_diff(resumed, fresh) << ", -> fsdp x3 "
            << max_diff(resumed, moved) << ", momentum dropped " << max_diff(resumed, without_momentum) << std::endl;
  EXPECT_LE(max_diff(resumed, fresh), 1e-6);
  EXPECT_LE(max_diff(resumed, moved), 1e-5);
  EXPECT_GT(max_diff(resumed, without_momentum), 1e-4) << "the momentum buffers were not what the resume restored";
}

/// The message of the c10::Error that `fn` throws ("" if none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

void copy_dir(const fs::path& from, const fs::path& to) {
  fs::remove_all(to);
  fs::copy(from, to, fs::copy_options::recursive);
}

TEST(CheckpointFaultTest, CorruptOrMissingFilesAreOneErrorNamingTheFile) {
  TempDir tmp;
  const auto good = tmp.path / "good";
  const auto full = tmp.path / "full";
  run({"oss", 2}, 11, "", {{good.string(), "sharded"}, {full.string(), "full"}});
  const auto bad = tmp.path / "bad";
  const Config loader{"single", 1};
  // Truncated shard.
  copy_dir(good, bad);
  const auto shard = bad / "shard-1-of-2.bin";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  auto msg = error_of([&] { run(loader, 5, bad.string()); });
  EXPECT_NE(msg.find("shard-1-of-2.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("corrupt"), std::string::npos) << msg;
  // One flipped bit in the consolidated file.
  copy_dir(full, bad);
  {
    std::fstream f(bad / "full.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(1000);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(1000);
    f.write(&c, 1);
  }
  msg = error_of([&] { run(loader, 5, bad.string()); });
  EXPECT_NE(msg.find("full.bin' is corrupt (block 0: crc32"), std::string::npos) << msg;
  // A changed value in metadata.json (its body's checksum).
  copy_dir(good, bad);
  {
    std::ifstream in(bad / "metadata.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto at = text.find("\"step\": 3");
    ASSERT_NE(at, std::string::npos) << text.substr(0, 400);
    text.replace(at, 9, "\"step\": 4");
    std::ofstream(bad / "metadata.json", std::ios::trunc) << text;
  }
  msg = error_of([&] { run(loader, 5, bad.string()); });
  EXPECT_NE(msg.find("metadata.json' is corrupt (crc32"), std::string::npos) << msg;
  // No metadata: an interrupted save.
  copy_dir(good, bad);
  fs::remove(bad / "metadata.json");
  msg = error_of([&] { run(loader, 5, bad.string()); });
  EXPECT_NE(msg.find("is not a complete strata checkpoint"), std::string::npos) << msg;
  // The intact copies load.
  EXPECT_EQ(error_of([&] { run(loader, 5, good.string()); }), "");
  EXPECT_EQ(error_of([&] { run({"fsdp", 2}, 5, full.string()); }), "");
}

/// `from` renamed `to` wherever metadata.json's body names it (its files and
/// the tensors' pieces), with the body's checksum made anew: what a crafted
/// checkpoint would hold.
void rename_data_file(const fs::path& dir, const std::string& from, const std::string& to) {
  std::ifstream in(dir / "metadata.json");
  auto body = nlohmann::json::parse(in)["body"];
  std::function<void(nlohmann::json&)> walk = [&](nlohmann::json& j) {
    if (j.is_string() && j.get<std::string>() == from) j = to;
    if (j.is_structured()) for (auto& v : j) walk(v);
  };
  walk(body);
  body["files"][to] = body["files"][from];
  body["files"].erase(from);
  strata::checkpoint_detail::write_metadata(dir, body);
}

TEST(CheckpointFaultTest, ADataFileOutsideItsDirectoryIsRefusedUnread) {
  // Each crafted checkpoint's data file is a good copy outside the
  // checkpoint, so loading it would succeed: the refusal is what fails it
  // (seen: with data_file() not checking, all three load).
  TempDir tmp;
  const auto good = tmp.path / "good";
  run({"oss", 2}, 11, "", {{good.string(), "sharded"}});
  const auto bad = tmp.path / "bad";
  const auto outside = tmp.path / "outside-shard.bin";
  fs::copy_file(good / "shard-1-of-2.bin", outside);
  const Config loader{"single", 1};
  for (const std::string& name : {std::string("../outside-shard.bin"), outside.string()}) {
    fs::remove_all(bad);
    copy_dir(good, bad);
    rename_data_file(bad, "shard-1-of-2.bin", name);
    const auto msg = error_of([&] { run(loader, 5, bad.string()); });
    EXPECT_NE(msg.find("names data file '" + name + "', which is not a file name inside"), std::string::npos) << msg;
  }
  // A data file that is a link out of the directory.
  fs::remove_all(bad);
  copy_dir(good, bad);
  fs::remove(bad / "shard-1-of-2.bin");
  fs::create_symlink(outside, bad / "shard-1-of-2.bin");
  const auto msg = error_of([&] { run(loader, 5, bad.string()); });
  EXPECT_NE(msg.find("data file 'shard-1-of-2.bin' is a link to"), std::string::npos) << msg;
  EXPECT_NE(strata::checkpoint_incomplete_reason(bad.string()).find("is a link to"), std::string::npos)
      << "--resume auto skips it";
  // A link that stays inside loads.
  fs::remove_all(bad);
  copy_dir(good, bad);
  fs::rename(bad / "shard-1-of-2.bin", bad / "kept.bin");
  fs::create_symlink("kept.bin", bad / "shard-1-of-2.bin");
  EXPECT_EQ(error_of([&] { run(loader, 5, bad.string()); }), "");
}

TEST(CheckpointFaultTest, DifferentModelOrOptimizerIsOneError) {
  TempDir tmp;
  const auto dir = tmp.path / "ckpt";
  run({"fsdp", 2}, 11, "", {{dir.string(), "sharded"}});
  // One more layer: its tensors are missing from the checkpoint.
  auto msg = error_of([&] { run({"ddp", 2}, 5, dir.string(), {}, /*n_layer=*/3); });
  EXPECT_NE(msg.find("does not match this model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing from the checkpoint"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model/h2."), std::string::npos) << msg;
  // One layer fewer: unexpected tensors.
  msg = error_of([&] { run({"single", 1}, 5, dir.string(), {}, /*n_layer=*/1); });
  EXPECT_NE(msg.find("unexpected in the checkpoint"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model/h1."), std::string::npos) << msg;
  msg = error_of([&] { run({"single", 1}, 5, dir.string(), {}, 2, "sgd"); });
  EXPECT_NE(msg.find("holds adamw optimizer state but this run's optimizer is sgd"), std::string::npos) << msg;
}

TEST(CheckpointFaultTest, RankKilledMidSaveLeavesThePreviousCheckpoint) {
  // Real processes (SIGKILL would end a thread world): strata-gpt under fsdp
  // on 2 ranks saves every 2 steps; the save of step 4 is killed at each
  // point. The newest complete checkpoint must stay step-2, and load.
  TempDir tmp;
  const std::string common =
      "--preset gpt-nano --data addition:2 --max-steps 4 --checkpoint-every 2 --checkpoint-keep 3 --strategy fsdp "
      "--nproc 2 --batch-size 2 --threads-per-rank 1 --limit-val-batches 0 --progress-bar false --comm-timeout 60";
  for (const std::string point : {"after-shard@1/4", "before-metadata/4", "before-rename/4"}) {
    const auto out = tmp.path / point.substr(0, point.find_first_of("@/"));
    auto killed = strata::testing::run_gpt_binary(common + " --output-dir " + out.string(),
                                                  "STRATA_CHECKPOINT_KILL_AT=" + point);
    EXPECT_NE(killed.exit_code, 0) << point << "\n" << killed.output;
    const auto ckpts = (out / "checkpoints").string();
    EXPECT_EQ(strata::latest_checkpoint(ckpts), (out / "checkpoints" / "step-2").string()) << point;
    auto resumed = strata::testing::run_gpt_binary(common + " --output-dir " + (out / "resumed").string() +
                                                   " --resume " + strata::latest_checkpoint(ckpts));
    EXPECT_EQ(resumed.exit_code, 0) << point << "\n" << resumed.output;
    EXPECT_TRUE(fs::exists(out / "resumed" / "checkpoints" / "step-4" / "metadata.json")) << point;
  }
}

TEST(CheckpointMemoryTest, FullSaveUnderFsdpHoldsParamsPlusOneUnitsStateOnRankZero) {
#ifndef STRATA_BENCH_BINARY
  GTEST_SKIP() << "strata-bench is not built (STRATA_BUILD_BENCH off): the measurement runs in its checkpoint suite";
#else
  // Real processes (a thread world shares one allocator): strata-bench's
  // checkpoint suite runs gpt-mini under fsdp x 4 and records each rank's
  // MemoryTracker peak from just before each save.
  TempDir tmp;
  const auto json_path = tmp.path / "ckpt.jsonl";
  const std::string command = std::string(STRATA_BENCH_BINARY) + " --suite checkpoint --presets gpt-mini --dir " +
                              (tmp.path / "work").string() + " --json " + json_path.string() + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream in(json_path);
  std::vector<nlohmann::json> ranks;
  for (std::string line; std::getline(in, line);) ranks.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(ranks.size(), 4u);
  // The yardstick from the model itself: full parameters (fp32) plus the
  // largest unit's full AdamW state (8 bytes per element); units are the
  // blocks and the root (everything outside a block).
  GPTModule module(strata::recipes::gpt_preset("gpt-mini"), /*deferred=*/true);
  std::map<std::string, int64_t> unit_numel;
  int64_t total = 0;
  for (const auto& item : module.module().named_parameters()) {
    const auto& name = item.key();
    // Blocks are registered as h0, h1, ...
    const bool block = name.size() > 1 && name[0] == 'h' && std::isdigit(static_cast<unsigned char>(name[1]));
    const std::string unit = block ? name.substr(0, name.find('.')) : "root";
    unit_numel[unit] += item.value().numel();
    total += item.value().numel();
  }
  int64_t largest = 0;
  for (const auto& [unit, n] : unit_numel) largest = std::max(largest, n);
  const double bound = 1.1 * (4.0 * total + 8.0 * largest);
  const auto& rank0 = ranks[0]["rank"] == 0 ? ranks[0] : ranks[1];
  EXPECT_LT(rank0["full"]["save_peak_bytes"].get<double>(), bound)
      << "params " << total << ", largest unit " << largest << ": " << rank0.dump();
  // A sharded save writes each byte of saved state once across the ranks:
  // 12 bytes per parameter (fp32 values, exp_avg, exp_avg_sq; gradients, the
  // other 4 of the 16 bytes of model state, are not saved) plus the step
  // counts and alignment.
  double written = 0;
  for (const auto& r : ranks) written += r["sharded"]["bytes_written"].get<double>();
  EXPECT_NEAR(written / (12.0 * total), 1.0, 0.02) << written;
#endif
}

TEST(CheckpointOffloadTest, OffloadedStateSavesAndLoadsAcrossStrategiesAndWorldSizes) {
  // Offloaded state is streamed from the tier into either format and back
  // into any layout, offloaded or resident: fsdp's shards and moments, sdp's
  // moments (its parameters stay resident).
  const std::vector<std::tuple<Config, Config, Config>> matrix = {
      {{"fsdp", 2, "disk"}, {"fsdp", 3, "disk"}, {"single", 1}},
      {{"sdp", 2, "disk"}, {"fsdp", 2, "disk"}, {"ddp", 3, "disk"}},
      {{"ddp", 2}, {"fsdp", 2, "disk"}, {"oss", 3, "disk"}},
  };
  TempDir tmp;
  for (const auto& [source, to_full, to_sharded] : matrix) {
    const auto full_dir = (tmp.path / (label(source) + "-full")).string();
    const auto sharded_dir = (tmp.path / (label(source) + "-sharded")).string();
    run(source, 11, "", {{full_dir, "full"}, {sharded_dir, "sharded"}});
    ASSERT_TRUE(fs::exists(fs::path(full_dir) / "metadata.json")) << label(source);
    const auto reference = run({source.strategy, source.world}, 99, sharded_dir);  // resident, same layout
    const auto fresh = run(source, 11, "");
    const auto from_full = run(to_full, 98, full_dir);
    const auto from_sharded = run(to_sharded, 97, sharded_dir);
    std::cout << label(source) << ": resumed resident vs uninterrupted " << max_diff(reference, fresh) << ", full -> "
              << label(to_full) << " " << max_diff(reference, from_full) << ", sharded -> " << label(to_sharded)
              << " " << max_diff(reference, from_sharded) << std::endl;
    EXPECT_LE(max_diff(reference, fresh), 1e-5) << label(source);
    EXPECT_LE(max_diff(reference, from_full), 1e-5) << label(source) << " full -> " << label(to_full);
    EXPECT_LE(max_diff(reference, from_sharded), 1e-5) << label(source) << " sharded -> " << label(to_sharded);
  }
}

}  // namespace

namespace {

// A save that runs out of disk (a 2.6 MB tmpfs in a private mount namespace:
// room for two gpt-nano checkpoints, not a third before the oldest is pruned)
// fails every rank with one error naming the cause, removes its partial copy,
// and leaves the earlier checkpoints loadable — in both formats.
TEST(CheckpointDiskTest, RunningOutOfDiskKeepsThePreviousCheckpointAndIsOneClearError) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  if (std::system("command -v unshare >/dev/null 2>&1") != 0) GTEST_SKIP() << "unshare (util-linux) is missing";
  // full and sharded (auto) formats, and a sharded one written on a thread
  // (--checkpoint-async: the failure surfaces at the step that completes it).
  for (const std::string variant : {"ddp", "fsdp", "fsdp --checkpoint-async"}) {
    SCOPED_TRACE(variant);
    const std::string strategy = variant;
    const std::string tag = variant.substr(0, variant.find(' ')) + (variant.find("async") != std::string::npos ? "-async" : "");
    const fs::path dir = fs::temp_directory_path() / ("strata-enospc-" + tag + "-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const fs::path run = dir / "run";
    const std::string inner =
        "mount -t tmpfs -o size=2600k tmpfs " + dir.string() + " && " + STRATA_GPT_BINARY +
        " --preset gpt-nano --data addition:2 --max-steps 8 --checkpoint-every 2 --checkpoint-keep 2 --strategy " +
        strategy + " --nproc 2 --threads-per-rank 1 --limit-val-batches 1 --progress-bar false --comm-timeout 30"
        " --output-dir " + run.string() + "; echo \"rc=$?\"; ls -a " + (run / "checkpoints").string() + "; " +
        STRATA_EXPORT_BINARY + " " + (run / "checkpoints" / "step-4").string() + " " + (dir / "w.pt").string() +
        " && echo export-ok";
    const auto out = strata::testing::run_command("unshare --mount sh -c '" + inner + "'");
    fs::remove_all(dir);
    if (out.output.find("mount:") != std::string::npos || out.output.find("unshare:") != std::string::npos) {
      GTEST_SKIP() << "cannot mount a tmpfs in a private mount namespace here: " << out.output;
    }
    EXPECT_NE(out.output.find("rc=1"), std::string::npos) << out.output;
    EXPECT_NE(out.output.find("could not be written (rank "), std::string::npos) << out.output;
    EXPECT_NE(out.output.find("No space left on device"), std::string::npos) << out.output;
    EXPECT_NE(out.output.find("the newest complete checkpoint is " + (run / "checkpoints" / "step-4").string()),
              std::string::npos)
        << out.output;
    // The ranks raised the agreed error (both, on one line, unless the
    // launcher stopped the second first); none died of a closed connection.
    EXPECT_NE(out.output.find(" failed (exit code 1): step 6: checkpoint"), std::string::npos) << out.output;
    EXPECT_EQ(out.output.find("Connection closed"), std::string::npos) << out.output;
    EXPECT_EQ(out.output.find(".step-6.tmp\n"), std::string::npos) << "the partial copy was left:\n" << out.output;
    EXPECT_NE(out.output.find("step-2\nstep-4"), std::string::npos) << out.output;
    EXPECT_NE(out.output.find("export-ok"), std::string::npos) << "step-4 no longer loads:\n" << out.output;
  }
}

}  // namespace
