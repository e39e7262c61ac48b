// checkpoint_async_test - --checkpoint-async (trainer/checkpoint.h,
// AsyncCheckpointSave; callbacks/model_checkpoint.h): the checkpoint holds
// the state of the step it was taken at, however far training has gone by
// the time its thread writes it; a run resumed from async checkpoints
// continues exactly like an uninterrupted one; async needs checkpoints and
// the sharded format. (Running out of disk: checkpoint_test's
// CheckpointDiskTest, which runs an async variant.)
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/strategies/registry.h"
#include "strata/strategies/thread_world.h"
#include "tests/run_binary.h"
#include "tests/temp_dir.h"
#include "tests/toy_data.h"
#include "strata/trainer/checkpoint.h"
#include "strata/trainer/trainer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>

namespace {
namespace fs = std::filesystem;

/// At step 3: a sync checkpoint into `reference` and an async one into
/// `async` whose write is held back until step 6, then finished.
class HeldAsyncSave : public strata::Callback {
 public:
  HeldAsyncSave(std::string reference, std::string async) : reference_(std::move(reference)), async_(std::move(async)) {}
  std::string name() const override { return "HeldAsyncSave"; }
  void on_train_step_end(strata::Trainer& t, strata::TrainingModule&, int64_t step) override {
    if (step == 3) {
      t.save_checkpoint(reference_, "sharded");
      strata::CheckpointMeta meta;
      meta.step = step;
      meta.world_size = t.strategy().world_size();
      meta.strategy = t.strategy().name();
      meta.format = "sharded";
      auto released = release_.get_future().share();
      save_ = std::make_unique<strata::AsyncCheckpointSave>(async_, t.strategy(), *t.optimizer(), meta,
                                                            [released] { released.wait(); });
    }
    if (step == 6) {
      EXPECT_FALSE(save_->written()) << "the write was not held back";
      release_.set_value();
      save_->finish(t.strategy().comm());
    }
  }

 private:
  std::string reference_, async_;
  // save_ first: destroyed last, after release_ (a fit that failed before
  // step 6 breaks the promise, so the held thread is let go before the join).
  std::unique_ptr<strata::AsyncCheckpointSave> save_;
  std::promise<void> release_;
};

TEST(CheckpointAsyncTest, TheSnapshotIsTheStepsStateWhateverTrainingDoesBeforeTheWrite) {
  for (const std::string strategy : {"ddp", "fsdp"}) {
    SCOPED_TRACE(strategy);
    strata::testing::TempDir dir("strata-async");
    std::vector<std::unique_ptr<strata::recipes::GPTModule>> modules;
    for (int r = 0; r < 2; ++r) {
      torch::manual_seed(11);
      modules.push_back(std::make_unique<strata::recipes::GPTModule>(
          strata::recipes::gpt_preset("gpt-nano").vocab_size(16).block_size(8).bias(false)));
    }
    strata::StrategyRegistry registry;
    strata::register_builtin_strategies(registry);
    strata::run_thread_world(2, [&](strata::Comm& comm) {
      auto held = std::make_shared<HeldAsyncSave>(dir.file("reference"), dir.file("async"));
      strata::testing::ToyData data;
      const auto options = strata::TrainerOptions().max_steps(6).batch_size(4).lr(1e-2).warmup_steps(1)
                               .limit_val_batches(0);
      strata::Trainer(options, registry.create(strategy, comm), {held}).fit(*modules[comm.rank()], data);
    }, std::chrono::seconds(60));
    const auto want = strata::read_checkpoint_tensors(dir.file("reference"), "");
    const auto got = strata::read_checkpoint_tensors(dir.file("async"), "");
    ASSERT_EQ(got.size(), want.size());
    ASSERT_GT(want.size(), 10u);
    for (const auto& [name, value] : want) {
      EXPECT_TRUE(torch::equal(got.at(name), value)) << name << " is not the step-3 value";
    }
  }
}

nlohmann::json summary_of(const fs::path& out) {
  std::ifstream in(out / "summary.json");
  return nlohmann::json::parse(in);
}

std::vector<std::string> losses(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::vector<std::string> out;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) out.push_back(line.substr(0, line.find(',', line.find(',') + 1)));  // step,loss
  return out;
}

TEST(CheckpointAsyncTest, ResumingFromAsyncCheckpointsContinuesExactlyUnderDdpAndFsdp) {
  strata::testing::TempDir dir("strata-async-run");
  const std::string common = "--preset gpt-nano --data addition:2 --warmup-steps 1 --dropout 0 --lr 0.01 "
                             "--min-lr 0.01 --threads-per-rank 1 --limit-val-batches 0 --log-every-n-steps 1 "
                             "--progress-bar false --nproc 2 --batch-size 4 ";
  for (const std::string strategy : {"ddp", "fsdp"}) {
    SCOPED_TRACE(strategy);
    const fs::path straight = dir.path() / (strategy + "-straight"), out = dir.path() / strategy;
    auto run = strata::testing::run_gpt_binary(common + "--strategy " + strategy + " --max-steps 8 --output-dir " +
                                               straight.string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    run = strata::testing::run_gpt_binary(common + "--strategy " + strategy + " --max-steps 5 --checkpoint-every 2 "
                                          "--checkpoint-keep 0 --checkpoint-async --output-dir " + out.string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    for (const char* step : {"step-2", "step-4", "step-5"}) {
      EXPECT_TRUE(fs::exists(out / "checkpoints" / step / "metadata.json")) << step << " was not published";
    }
    const auto saves = summary_of(out).at("checkpoint_saves");
    ASSERT_EQ(saves.size(), 3u) << saves.dump();
    for (const auto& s : saves) {
      EXPECT_TRUE(s.at("async").get<bool>());
      EXPECT_GT(s.at("write_s").get<double>(), 0.0) << s.dump();
    }
    run = strata::testing::run_gpt_binary(common + "--strategy " + strategy + " --max-steps 8 --resume " +
                                          (out / "checkpoints" / "step-4").string() + " --output-dir " + out.string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const auto a = losses(straight / "metrics.csv"), b = losses(out / "metrics.csv");
    ASSERT_EQ(a.size(), 8u);
    EXPECT_EQ(a, b) << "the resumed run's losses differ from the uninterrupted run's";
  }
}

TEST(CheckpointAsyncTest, AsyncWithoutCheckpointsOrWithTheFullFormatIsExitTwo) {
  const std::string common = "--preset gpt-nano --data addition:2 --max-steps 2 --progress-bar false --output-dir " +
                             (fs::temp_directory_path() / "strata-async-never").string() + " ";
  auto run = strata::testing::run_gpt_binary(common + "--checkpoint-async");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--checkpoint-async applies only with --checkpoint-every"), std::string::npos) << run.output;
  run = strata::testing::run_gpt_binary(common + "--checkpoint-async --checkpoint-every 1 --checkpoint-format full");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("writes the sharded format"), std::string::npos) << run.output;
  EXPECT_FALSE(fs::exists(fs::temp_directory_path() / "strata-async-never"));
}

}  // namespace
