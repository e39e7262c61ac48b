// Built-in callbacks. Each callback's arithmetic is tested through its public
// pure part (CsvLogger::add_row, Throughput::update, MemoryMonitor::sample,
// learning_rates, prune_checkpoints) with a real Trainer that never ran fit();
// one test runs a real fit() with all of them on a tiny model.
#include "strata/callbacks/csv_logger.h"
#include "strata/callbacks/early_stopping.h"
#include "strata/callbacks/lr_monitor.h"
#include "strata/callbacks/memory_monitor.h"
#include "strata/callbacks/model_checkpoint.h"
#include "strata/callbacks/progress.h"
#include "strata/callbacks/throughput.h"
#include "strata/recipes/app/peak_flops.h"
#include "strata/strategies/single/single_device.h"
#include "strata/trainer/memory.h"
#include "strata/trainer/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

namespace strata {
namespace {
namespace fs = std::filesystem;

/// One rank of a world of `size` that never communicates: enough for Comm to
/// report rank and size (every collective would throw).
class FakeProcessGroup : public c10d::ProcessGroup {
 public:
  FakeProcessGroup(int rank, int size) : c10d::ProcessGroup(rank, size) {}
  const std::string getBackendName() const override { return "fake"; }
};

/// The minimal Strategy: every base default.
class TestStrategy : public Strategy {
 public:
  explicit TestStrategy(Comm comm = Comm()) : Strategy(std::move(comm)) {}
  std::string name() const override { return "test"; }
};

std::shared_ptr<Strategy> strategy_of_rank(int rank, int size) {
  return std::make_shared<TestStrategy>(Comm(c10::make_intrusive<FakeProcessGroup>(rank, size)));
}

/// Embedding + linear next-token model over a 16-token vocabulary.
class TinyModule : public TrainingModule {
 public:
  TinyModule() {
    torch::manual_seed(0);
    net_ = torch::nn::Sequential(torch::nn::Embedding(16, 8), torch::nn::Linear(8, 16));
  }
  torch::nn::Module& module() override { return *net_; }
  torch::Tensor training_step(const Batch& batch) override {
    auto logits = net_->forward(batch.input);
    return torch::nn::functional::cross_entropy(
        logits.view({-1, 16}), batch.target.view({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
  }
  ValidationStep validation_step(const Batch& batch) override {
    auto logits = net_->forward(batch.input).view({-1, 16});
    auto target = batch.target.view({-1});
    ValidationStep out;
    out.loss_sum = torch::nn::functional::cross_entropy(
                       logits, target,
                       torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                       .item<double>();
    out.tokens = target.numel();
    auto right = logits.argmax(-1).eq(target).view({batch.input.size(0), -1}).all(1);
    out.correct_samples = right.sum().item<int64_t>();
    out.samples = batch.input.size(0);
    return out;
  }
  double flops_per_token() const override { return 6.0 * (16 * 8 + 8 * 16 + 16); }

 private:
  torch::nn::Sequential net_{nullptr};
};

/// Sequences counting up modulo 16; the target is the next token.
class CountingData : public DataSource {
 public:
  std::string name() const override { return "counting"; }
  Batch train_batch(int64_t index, int64_t batch_size, ShardInfo shard) const override {
    return make(index * 7, batch_size, shard);
  }
  Batch val_batch(int64_t index, int64_t batch_size, ShardInfo shard) const override {
    return make(1000 + index * 7, batch_size, shard);
  }
  int64_t num_val_samples() const override { return 16; }
  int64_t vocab_size() const override { return 16; }
  int64_t block_size() const override { return 4; }
  bool has_accuracy() const override { return true; }

 private:
  static Batch make(int64_t start, int64_t batch_size, ShardInfo shard) {
    auto rows = torch::arange(batch_size).add(start + shard.rank * batch_size).unsqueeze(1);
    auto input = (rows + torch::arange(4).unsqueeze(0)).remainder(16);
    return {input, (input + 1).remainder(16)};
  }
};

/// A fresh directory under the temp dir, removed at scope exit.
struct TempDir {
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() /
             ("strata_callbacks_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path path;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

Trainer make_trainer(std::shared_ptr<Strategy> strategy = std::make_shared<TestStrategy>(),
                     int64_t max_steps = 1500, const MemoryTracker* memory = nullptr) {
  return Trainer(TrainerOptions().max_steps(max_steps), std::move(strategy), {}, memory);
}

StepMetrics step_metrics(int64_t step, int64_t tokens, double seconds, double loss = 1.0) {
  StepMetrics m;
  m.step = step;
  m.loss = loss;
  m.lr = 1e-3;
  m.tokens = tokens;
  m.samples = tokens / 4;
  m.step_seconds = seconds;
  return m;
}

// ---- CsvLogger ---------------------------------------------------------------

TEST(CsvLoggerTest, HeaderIsUnionOfKeysWithEmptyCells) {
  TempDir dir("csv_union");
  CsvLogger logger(CsvLoggerOptions(dir.path.string()));
  logger.add_row(10, {{"loss", 2.5}, {"lr", 0.001}});
  logger.add_row(10, {{"val_loss", 2.25}});
  logger.add_row(20, {{"loss", 2.0}, {"lr", 0.001}, {"loss", 1.75}});  // last value wins
  logger.flush();
  EXPECT_EQ(logger.columns(), (std::vector<std::string>{"step", "loss", "lr", "val_loss"}));
  EXPECT_EQ(read_text(dir.path / "metrics.csv"),
            "step,loss,lr,val_loss\n"
            "10,2.5,0.001,\n"
            "10,,,2.25\n"
            "20,1.75,0.001,\n");
}

TEST(CsvLoggerTest, RewritesFileWhenNewKeysAppear) {
  TempDir dir("csv_rewrite");
  CsvLogger logger(CsvLoggerOptions(dir.path.string()).flush_every_n_rows(1));
  const fs::path file = dir.path / "metrics.csv";
  logger.add_row(1, {{"loss", 3.0}});
  EXPECT_EQ(read_text(file), "step,loss\n1,3\n");
  logger.add_row(2, {{"loss", 2.5}});  // same header: appended
  EXPECT_EQ(read_text(file), "step,loss\n1,3\n2,2.5\n");
  logger.add_row(3, {{"loss", 2.0}, {"val_loss", 1.5}});  // new key: whole file rewritten
  EXPECT_EQ(read_text(file), "step,loss,val_loss\n1,3,\n2,2.5,\n3,2,1.5\n");
  EXPECT_FALSE(fs::exists(dir.path / "metrics.csv.tmp"));
}

TEST(CsvLoggerTest, FlushesEveryNRowsAndAtFitEndIntoNewDirectory) {
  TempDir dir("csv_flush");
  const fs::path nested = dir.path / "a" / "b";
  CsvLogger logger(CsvLoggerOptions(nested.string()).flush_every_n_rows(3));
  Trainer trainer = make_trainer();
  TinyModule module;
  logger.on_log(trainer, 1, {{"loss", 1.0}});
  logger.on_log(trainer, 2, {{"loss", 1.0}});
  EXPECT_FALSE(fs::exists(nested / "metrics.csv"));
  logger.on_log(trainer, 3, {{"loss", 1.0}});
  EXPECT_EQ(read_text(nested / "metrics.csv"), "step,loss\n1,1\n2,1\n3,1\n");
  logger.on_log(trainer, 4, {{"loss", 0.5}});
  logger.on_fit_end(trainer, module);
  EXPECT_EQ(read_text(nested / "metrics.csv"), "step,loss\n1,1\n2,1\n3,1\n4,0.5\n");
  EXPECT_EQ(logger.path(), (nested / "metrics.csv").string());
}

TEST(CsvLoggerTest, OnlyRankZeroWrites) {
  TempDir dir("csv_rank1");
  CsvLogger logger(CsvLoggerOptions(dir.path.string()).flush_every_n_rows(1));
  Trainer trainer = make_trainer(strategy_of_rank(1, 2));
  TinyModule module;
  logger.on_log(trainer, 1, {{"loss", 1.0}});
  logger.on_fit_end(trainer, module);
  EXPECT_EQ(logger.num_rows(), 0);
  EXPECT_FALSE(fs::exists(dir.path / "metrics.csv"));
}

TEST(CsvLoggerTest, ResumedFitContinuesTheFileAndDropsLaterRows) {
  TempDir dir("csv_continue");
  const fs::path file = dir.path / "metrics.csv";
  // An interrupted run logged steps 1..4; its checkpoint was at step 2.
  std::ofstream(file) << "step,loss,\"odd,key\"\n1,3,\n2,2.5,\n2,,7\n3,2,\n4,1.5,\n";
  CsvLogger logger(CsvLoggerOptions(dir.path.string()).flush_every_n_rows(1));
  EXPECT_EQ(logger.continue_file(2), 2);
  EXPECT_EQ(logger.columns(), (std::vector<std::string>{"step", "loss", "odd,key"}));
  EXPECT_EQ(logger.num_rows(), 3);
  EXPECT_EQ(read_text(file), "step,loss,\"odd,key\"\n1,3,\n2,2.5,\n2,,7\n");
  logger.add_row(3, {{"loss", 1.75}});  // appended under the same header
  EXPECT_EQ(read_text(file), "step,loss,\"odd,key\"\n1,3,\n2,2.5,\n2,,7\n3,1.75,\n");
  logger.add_row(4, {{"loss", 1.5}, {"val_loss", 1.25}});  // a new key rewrites it all
  EXPECT_EQ(read_text(file),
            "step,loss,\"odd,key\",val_loss\n1,3,,\n2,2.5,,\n2,,7,\n3,1.75,,\n4,1.5,,1.25\n");
  // Nothing to drop: the file is left as it is; no file: a new one starts.
  CsvLogger same(CsvLoggerOptions(dir.path.string()));
  EXPECT_EQ(same.continue_file(4), 0);
  EXPECT_EQ(same.num_rows(), 5);
  CsvLogger fresh(CsvLoggerOptions((dir.path / "none").string()));
  EXPECT_EQ(fresh.continue_file(4), 0);
  EXPECT_EQ(fresh.num_rows(), 0);
  fs::create_directories(dir.path / "bad");
  std::ofstream(dir.path / "bad" / "metrics.csv") << "step,loss\nx,1\n";
  CsvLogger bad(CsvLoggerOptions((dir.path / "bad").string()));
  EXPECT_THROW(bad.continue_file(1), c10::Error);
}

TEST(CsvLoggerTest, RejectsBadOptions) {
  try {
    CsvLogger logger(CsvLoggerOptions("x").flush_every_n_rows(0));
    FAIL() << "expected c10::Error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("flush_every_n_rows must be >= 1, got 0"),
              std::string::npos);
  }
}

// ---- ProgressBar -------------------------------------------------------------

TEST(ProgressBarTest, PlainLineFormat) {
  std::ostringstream out;
  ProgressBar bar(ProgressBarOptions().mode(ProgressMode::kPlain), out);
  EXPECT_FALSE(bar.live());
  Trainer trainer = make_trainer();
  TinyModule module;
  bar.on_fit_start(trainer, module);
  bar.on_train_batch_end(trainer, module, step_metrics(99, 1000, 10.0));  // warm-up
  bar.on_train_batch_end(trainer, module, step_metrics(100, 1000, 0.5));
  bar.on_log(trainer, 100,
             {{"loss", 1.23454}, {"lr", 3e-3}, {"grad_norm", 0.5}, {"tokens_per_s", 12345.4}});
  // eta: 1400 steps left at 0.5 s per step (the warm-up step excluded).
  EXPECT_EQ(out.str(), "step 100/1500 | loss 1.2345 | lr 3.00e-03 | 12345 tok/s | grad_norm 0.5 | eta 11m40s\n");
}

TEST(ProgressBarTest, UsesOwnTokenRateWithoutThroughputCallback) {
  std::ostringstream out;
  ProgressBar bar(ProgressBarOptions().mode(ProgressMode::kPlain), out);
  Trainer trainer = make_trainer(std::make_shared<TestStrategy>(), 10);
  TinyModule module;
  bar.on_fit_start(trainer, module);
  bar.on_train_batch_end(trainer, module, step_metrics(1, 1000, 10.0));  // excluded
  bar.on_train_batch_end(trainer, module, step_metrics(2, 1000, 0.5));
  bar.on_log(trainer, 2, {{"loss", 2.0}, {"lr", 1e-3}});
  EXPECT_EQ(out.str(), "step 2/10 | loss 2.0000 | lr 1.00e-03 | 2000 tok/s | eta 4s\n");
}

TEST(ProgressBarTest, PrintsValidationOnceAndSkipsValidationOnlyRows) {
  std::ostringstream out;
  ProgressBar bar(ProgressBarOptions().mode(ProgressMode::kPlain), out);
  Trainer trainer = make_trainer();
  TinyModule module;
  bar.on_fit_start(trainer, module);
  ValidationMetrics val;
  val.step = 100;
  val.loss = 1.5;
  val.accuracy = 0.75;
  bar.on_validation_end(trainer, module, val);
  bar.on_log(trainer, 100, {{"val_loss", 1.5}, {"val_accuracy", 0.75}});
  EXPECT_EQ(out.str(), "validation step 100 | val_loss 1.5000 | val_accuracy 0.7500\n");
  val.accuracy.reset();
  out.str("");
  bar.on_validation_end(trainer, module, val);
  EXPECT_EQ(out.str(), "validation step 100 | val_loss 1.5000\n");
}

TEST(ProgressBarTest, SilentOnOtherRanks) {
  std::ostringstream out;
  ProgressBar bar(ProgressBarOptions().mode(ProgressMode::kPlain), out);
  Trainer trainer = make_trainer(strategy_of_rank(1, 2));
  TinyModule module;
  bar.on_fit_start(trainer, module);
  bar.on_train_batch_end(trainer, module, step_metrics(1, 1000, 1.0));
  bar.on_log(trainer, 1, {{"loss", 1.0}});
  ValidationMetrics val;
  bar.on_validation_end(trainer, module, val);
  bar.on_fit_end(trainer, module);
  EXPECT_EQ(out.str(), "");
}

TEST(ProgressBarTest, LiveModeRedrawsOneLineInPlace) {
  std::ostringstream out;
  // One redraw per 1000 s: only the first draw and the forced last one happen.
  ProgressBar bar(ProgressBarOptions().mode(ProgressMode::kLive).refresh_hz(1e-3).bar_width(10), out);
  EXPECT_TRUE(bar.live());
  Trainer trainer = make_trainer(std::make_shared<TestStrategy>(), 3);
  TinyModule module;
  bar.on_fit_start(trainer, module);
  for (int64_t step = 1; step <= 3; ++step) {
    bar.on_train_batch_end(trainer, module, step_metrics(step, 100, 0.1));
    bar.on_log(trainer, step, {{"loss", 1.0}});  // no plain lines in live mode
  }
  const std::string drawn = out.str();
  EXPECT_EQ(std::count(drawn.begin(), drawn.end(), '\r'), 2);
  EXPECT_EQ(drawn.find('\n'), std::string::npos);
  EXPECT_NE(drawn.find("step 3/3 [==========] 100% | loss 1.0000 | lr 1.00e-03 | 1000 tok/s"),
            std::string::npos)
      << drawn;
  bar.on_fit_end(trainer, module);
  EXPECT_EQ(out.str().back(), '\n');
}

TEST(ProgressBarTest, AutoModeIsPlainForAnyStreamButStdout) {
  std::ostringstream out;
  EXPECT_FALSE(ProgressBar(ProgressBarOptions(), out).live());
  EXPECT_THROW(ProgressBar(ProgressBarOptions().refresh_hz(0.0), out), c10::Error);
}

// ---- Throughput --------------------------------------------------------------

TEST(ThroughputTest, RollingAverageExcludesFirstStep) {
  Throughput tp(ThroughputOptions().window(3).peak_flops(1e12));
  EXPECT_TRUE(tp.update(step_metrics(1, 1000, 100.0), 1, 0.0).empty());  // warm-up
  EXPECT_EQ(tp.tokens_per_s(), 0.0);
  for (int64_t step = 2; step <= 4; ++step) tp.update(step_metrics(step, 1000, 1.0), 1, 0.0);
  EXPECT_DOUBLE_EQ(tp.tokens_per_s(), 1000.0);
  EXPECT_DOUBLE_EQ(tp.samples_per_s(), 250.0);
  const LogRow row = tp.update(step_metrics(5, 4000, 1.0), 1, 0.0);
  // Window = steps 3..5: 6000 tokens in 3 s. All but the first: 7000 in 4 s.
  EXPECT_DOUBLE_EQ(tp.tokens_per_s(), 2000.0);
  EXPECT_DOUBLE_EQ(tp.average_tokens_per_s(), 1750.0);
  EXPECT_EQ(tp.steps(), 5);
  ASSERT_EQ(row.size(), 2u);  // no flops_per_token: no "mfu"
  EXPECT_EQ(row[0].first, "tokens_per_s");
  EXPECT_DOUBLE_EQ(row[0].second, 2000.0);
  EXPECT_EQ(row[1].first, "samples_per_s");
  EXPECT_DOUBLE_EQ(row[1].second, 500.0);
  EXPECT_EQ(tp.mfu(), 0.0);
}

TEST(ThroughputTest, MfuIsPerRankTokenFlopsOverPeak) {
  Throughput tp(ThroughputOptions().peak_flops(1e9));
  tp.update(step_metrics(1, 4000, 5.0), 2, 1000.0);
  const LogRow row = tp.update(step_metrics(2, 4000, 1.0), 2, 1000.0);
  // 4000 tok/s over 2 ranks = 2000 tok/s per rank × 1000 FLOP/token = 2e6 FLOP/s.
  ASSERT_EQ(row.size(), 3u);
  EXPECT_EQ(row[2].first, "mfu");
  EXPECT_DOUBLE_EQ(row[2].second, 2e-3);
  EXPECT_DOUBLE_EQ(tp.mfu(), 2e-3);
  EXPECT_DOUBLE_EQ(tp.peak_flops(), 1e9);
}

TEST(ThroughputTest, AnMfuAboveOneIsReportedAsUnknown) {
  // 1000 tok/s × 1000 FLOP/token = 1e6 FLOP/s against a peak of 1e5: the
  // peak is wrong, not the run.
  Throughput tp(ThroughputOptions().peak_flops(1e5));
  tp.update(step_metrics(1, 1000, 5.0), 1, 1000.0);
  const LogRow row = tp.update(step_metrics(2, 1000, 1.0), 1, 1000.0);
  ASSERT_EQ(row.size(), 2u);  // tokens_per_s, samples_per_s; no "mfu"
  EXPECT_EQ(tp.mfu(), 0.0);
  EXPECT_TRUE(tp.mfu_above_one());
}

TEST(PeakFlopsTest, MeasuredOnceThenReadFromTheCache) {
  TempDir dir("peak");
  const std::string cache = (dir.path / "sub" / "peak_flops.json").string();
  const auto first = strata::recipes::cpu_peak_flops(1, "fp32", cache);
  EXPECT_EQ(first.source, "measured");
  EXPECT_GT(first.flops, 1e8);  // any BLAS exceeds 0.1 GFLOP/s
  ASSERT_TRUE(std::filesystem::exists(cache));
  const auto second = strata::recipes::cpu_peak_flops(1, "fp32", cache);
  EXPECT_EQ(second.source, "cached (" + cache + ")");
  EXPECT_EQ(second.flops, first.flops);
  // Another dtype is another key: measured, and both stay cached.
  EXPECT_EQ(strata::recipes::cpu_peak_flops(1, "bf16", cache).source, "measured");
  EXPECT_EQ(strata::recipes::cpu_peak_flops(1, "fp32", cache).source, "cached (" + cache + ")");
  // A damaged cache is measured again, not an error.
  std::ofstream(cache) << "{not json";
  EXPECT_EQ(strata::recipes::cpu_peak_flops(1, "fp32", cache).source, "measured");
}

TEST(ThroughputTest, MeasuresPeakOnceAtFitStart) {
  const double flops = measure_matmul_peak_flops(128, 2);
  EXPECT_GT(flops, 0.0);
  EXPECT_TRUE(std::isfinite(flops));
  Throughput tp(ThroughputOptions().peak_matmul_size(64));
  EXPECT_EQ(tp.peak_flops(), 0.0);
  Trainer trainer = make_trainer();
  TinyModule module;
  tp.on_fit_start(trainer, module);
  EXPECT_GT(tp.peak_flops(), 0.0);
  EXPECT_TRUE(std::isfinite(tp.peak_flops()));
  EXPECT_THROW(measure_matmul_peak_flops(0), c10::Error);
  EXPECT_THROW(Throughput(ThroughputOptions().window(0)), c10::Error);
}

TEST(ThroughputTest, BlasCheckWarnsBelowThreshold) {
  const BlasCheck slow = check_blas_speed(1e12);  // no machine does 1 PFLOP/s
  EXPECT_TRUE(slow.slow);
  EXPECT_GT(slow.gflops, 0.0);
  EXPECT_EQ(slow.message.rfind("WARNING: matrix products run at ", 0), 0u) << slow.message;
  // The wheel's MKL is built in: what slows it is oversubscribed cores.
  EXPECT_NE(slow.message.find(" GFLOP/s (expected >= 1000000000000.0): LibTorch's BLAS is starved; check that "
                              "other jobs, OMP_NUM_THREADS or --threads-per-rank times ranks do not "
                              "oversubscribe the cores"),
            std::string::npos)
      << slow.message;
  EXPECT_EQ(slow.message.find('\n'), std::string::npos);
  const BlasCheck fine = check_blas_speed(0.0);
  EXPECT_FALSE(fine.slow);
  EXPECT_EQ(fine.message.find("WARNING"), std::string::npos) << fine.message;
}

// ---- MemoryMonitor -----------------------------------------------------------

TEST(MemoryMonitorTest, SamplesTrackerAndPeakRss) {
  MemoryMonitor monitor;
  MemoryTracker tracker;
  {
    auto t = torch::ones({1 << 18});  // 1 MiB
    const LogRow row = monitor.sample(&tracker);
    ASSERT_EQ(row.size(), 3u);
    EXPECT_EQ(row[0].first, "mem_current_mib");
    EXPECT_GE(row[0].second, 1.0);
    EXPECT_EQ(row[1].first, "mem_peak_mib");
    EXPECT_GE(row[1].second, row[0].second);
    EXPECT_EQ(row[2].first, "rss_peak_mib");
    EXPECT_GT(row[2].second, 0.0);
  }
  EXPECT_GE(monitor.peak_tensor_bytes(), int64_t{1} << 20);
  EXPECT_GT(monitor.peak_rss_bytes(), 0);
}

TEST(MemoryMonitorTest, WithoutTrackerLogsOnlyRss) {
  MemoryMonitor monitor;
  const LogRow row = monitor.sample(nullptr);
  ASSERT_EQ(row.size(), 1u);
  EXPECT_EQ(row[0].first, "rss_peak_mib");
  EXPECT_EQ(monitor.peak_tensor_bytes(), 0);
  EXPECT_TRUE(MemoryMonitor(MemoryMonitorOptions().log_rss(false)).sample(nullptr).empty());
  // No optimizer (fit never ran): no model state.
  Trainer trainer = make_trainer();
  TinyModule module;
  monitor.on_fit_end(trainer, module);
  EXPECT_FALSE(monitor.model_state().has_value());
}

// ---- EarlyStopping -----------------------------------------------------------

ValidationMetrics val_metrics(int64_t step, double loss) {
  ValidationMetrics m;
  m.step = step;
  m.loss = loss;
  return m;
}

TEST(EarlyStoppingTest, StopsAfterPatienceValidationsWithoutImprovement) {
  EarlyStopping stopper(EarlyStoppingOptions().patience(3));
  Trainer trainer = make_trainer();
  TinyModule module;
  stopper.on_fit_start(trainer, module);
  const double losses[] = {2.0, 1.5, 1.6, 1.5, 1.55};  // 1.5 again is no improvement
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(trainer.should_stop()) << "validation " << i;
    stopper.on_validation_end(trainer, module, val_metrics(10 * (i + 1), losses[i]));
  }
  EXPECT_TRUE(trainer.should_stop());
  EXPECT_TRUE(stopper.stopped());
  EXPECT_EQ(stopper.wait_count(), 3);
  EXPECT_EQ(*stopper.best(), 1.5);
  EXPECT_EQ(stopper.reason(),
            "val_loss did not improve by more than 0 in 3 validations (best 1.5, last 1.55 at step 50)");
}

TEST(EarlyStoppingTest, StateDictCarriesBestAndWaitAcrossAResume) {
  Trainer trainer = make_trainer();
  TinyModule module;
  EarlyStopping before(EarlyStoppingOptions().patience(3));
  before.on_fit_start(trainer, module);
  EXPECT_EQ(before.state_dict(), "best none\nwait 0\n");
  for (double loss : {2.0, 0.1 + 0.2, 3.0}) before.on_validation_end(trainer, module, val_metrics(1, loss));
  EarlyStopping after(EarlyStoppingOptions().patience(3));
  after.on_fit_start(trainer, module);
  after.load_state_dict(before.state_dict());
  EXPECT_EQ(*after.best(), 0.1 + 0.2);  // exactly, not to 6 digits
  EXPECT_EQ(after.wait_count(), 1);
  after.on_validation_end(trainer, module, val_metrics(2, 0.5));
  EXPECT_FALSE(trainer.should_stop());
  after.on_validation_end(trainer, module, val_metrics(3, 0.5));
  EXPECT_TRUE(trainer.should_stop());  // 3 without improvement counting the one before the resume
  EXPECT_THROW(after.load_state_dict("best"), c10::Error);
}

TEST(EarlyStoppingTest, MinDeltaAndImprovementResetTheCount) {
  EarlyStopping stopper(EarlyStoppingOptions().patience(2).min_delta(0.1));
  Trainer trainer = make_trainer();
  TinyModule module;
  stopper.on_validation_end(trainer, module, val_metrics(1, 2.0));
  stopper.on_validation_end(trainer, module, val_metrics(2, 1.95));  // within min_delta
  EXPECT_EQ(stopper.wait_count(), 1);
  stopper.on_validation_end(trainer, module, val_metrics(3, 1.85));  // beats 2.0 - 0.1
  EXPECT_EQ(stopper.wait_count(), 0);
  EXPECT_EQ(*stopper.best(), 1.85);
  EXPECT_FALSE(trainer.should_stop());
}

TEST(EarlyStoppingTest, StopsOnNonFiniteTrainLoss) {
  Trainer trainer = make_trainer();
  TinyModule module;
  EarlyStopping lenient(EarlyStoppingOptions().check_finite(false));
  lenient.on_train_batch_end(trainer, module, step_metrics(7, 100, 1.0, std::nan("")));
  EXPECT_FALSE(trainer.should_stop());
  EarlyStopping stopper;
  stopper.on_train_batch_end(trainer, module, step_metrics(6, 100, 1.0, 2.0));
  EXPECT_FALSE(trainer.should_stop());
  stopper.on_train_batch_end(trainer, module, step_metrics(7, 100, 1.0, std::nan("")));
  EXPECT_TRUE(trainer.should_stop());
  EXPECT_EQ(stopper.reason(), "train loss is nan at step 7");
  stopper.on_train_batch_end(trainer, module,
                             step_metrics(8, 100, 1.0, std::numeric_limits<double>::infinity()));
  EXPECT_EQ(stopper.reason(), "train loss is nan at step 7");  // the first reason stays
}

TEST(EarlyStoppingTest, MaxModeOnAccuracyNeedsAccuracy) {
  EarlyStopping stopper(EarlyStoppingOptions().monitor("val_accuracy").mode(MonitorMode::kMax).patience(1));
  Trainer trainer = make_trainer();
  TinyModule module;
  auto m = val_metrics(1, 1.0);
  m.accuracy = 0.5;
  stopper.on_validation_end(trainer, module, m);
  m.accuracy = 0.6;
  stopper.on_validation_end(trainer, module, m);
  EXPECT_FALSE(trainer.should_stop());
  m.accuracy = 0.55;
  stopper.on_validation_end(trainer, module, m);
  EXPECT_TRUE(trainer.should_stop());
  m.accuracy.reset();
  EXPECT_THROW(stopper.on_validation_end(trainer, module, m), c10::Error);
  EXPECT_THROW(EarlyStopping(EarlyStoppingOptions().monitor("loss")), c10::Error);
  EXPECT_THROW(EarlyStopping(EarlyStoppingOptions().patience(0)), c10::Error);
}

// ---- LrMonitor ---------------------------------------------------------------

TEST(LrMonitorTest, LogsGroupsOnlyWhenTheyDiffer) {
  auto a = torch::zeros({2}, torch::requires_grad());
  auto b = torch::zeros({2}, torch::requires_grad());
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{a}, std::make_unique<torch::optim::SGDOptions>(0.1));
  groups.emplace_back(std::vector<torch::Tensor>{b}, std::make_unique<torch::optim::SGDOptions>(0.1));
  torch::optim::SGD sgd(std::move(groups), torch::optim::SGDOptions(0.1));
  EXPECT_EQ(learning_rates(sgd), (LogRow{{"lr", 0.1}}));
  sgd.param_groups()[1].options().set_lr(0.01);
  EXPECT_EQ(learning_rates(sgd, "opt/"),
            (LogRow{{"opt/lr", 0.1}, {"opt/lr-group0", 0.1}, {"opt/lr-group1", 0.01}}));
  // Before fit() the trainer has no optimizer: nothing to log, no crash.
  LrMonitor monitor;
  Trainer trainer = make_trainer();
  TinyModule module;
  monitor.on_train_batch_end(trainer, module, step_metrics(1, 1, 1.0));
}

// ---- ModelCheckpoint ---------------------------------------------------------

TEST(ModelCheckpointTest, PruneKeepsNewestStepDirectories) {
  TempDir dir("ckpt_prune");
  for (const char* name : {"step-1", "step-2", "step-3", "step-10", "notes", "step-x", ".step-11.tmp"})
    fs::create_directories(dir.path / name);
  std::ofstream(dir.path / "step-12") << "a file, not a checkpoint";
  EXPECT_EQ(find_checkpoints(dir.path.string()),
            (std::vector<std::string>{(dir.path / "step-1").string(), (dir.path / "step-2").string(),
                                      (dir.path / "step-3").string(), (dir.path / "step-10").string()}));
  EXPECT_EQ(latest_checkpoint(dir.path.string()), (dir.path / "step-10").string());
  EXPECT_TRUE(prune_checkpoints(dir.path.string(), 0).empty());  // keep all
  EXPECT_TRUE(prune_checkpoints(dir.path.string(), 4).empty());
  EXPECT_EQ(prune_checkpoints(dir.path.string(), 2),
            (std::vector<std::string>{(dir.path / "step-1").string(), (dir.path / "step-2").string()}));
  for (const char* kept : {"step-3", "step-10", "notes", "step-x", ".step-11.tmp", "step-12"})
    EXPECT_TRUE(fs::exists(dir.path / kept)) << kept;
  EXPECT_FALSE(fs::exists(dir.path / "step-1"));
  EXPECT_FALSE(fs::exists(dir.path / "step-2"));
  EXPECT_TRUE(find_checkpoints((dir.path / "missing").string()).empty());
  EXPECT_EQ(latest_checkpoint((dir.path / "missing").string()), "");
}

/// Writes a marker instead of a real checkpoint and records where it wrote.
class MarkerCheckpoint : public ModelCheckpoint {
 public:
  using ModelCheckpoint::ModelCheckpoint;
  std::vector<std::string> written;

 protected:
  void write_checkpoint(Trainer& trainer, const std::string& dir) override {
    written.push_back(dir);
    std::ofstream(fs::path(dir) / "marker") << dir;
  }
};

TEST(ModelCheckpointTest, SavesEveryNStepsThroughATempDirectory) {
  TempDir dir("ckpt_every");
  const fs::path root = dir.path / "ckpt";
  MarkerCheckpoint checkpoint(ModelCheckpointOptions(root.string()).every_n_train_steps(2).keep_last(2));
  Trainer trainer = make_trainer();
  TinyModule module;
  for (int64_t step = 1; step <= 7; ++step) checkpoint.on_train_step_end(trainer, module, step);
  ASSERT_EQ(checkpoint.written.size(), 3u);
  EXPECT_EQ(checkpoint.written[0], (root / ".step-2.tmp").string());
  EXPECT_EQ(find_checkpoints(root.string()),
            (std::vector<std::string>{(root / "step-4").string(), (root / "step-6").string()}));
  EXPECT_EQ(read_text(root / "step-6" / "marker"), (root / ".step-6.tmp").string());
  EXPECT_FALSE(fs::exists(root / ".step-6.tmp"));
  EXPECT_EQ(checkpoint.last_checkpoint(), (root / "step-6").string());
  EXPECT_EQ(checkpoint.last_saved_step(), 6);
  // Saving a step again replaces it.
  checkpoint.save(trainer, 6);
  EXPECT_EQ(find_checkpoints(root.string()).size(), 2u);
  EXPECT_THROW(ModelCheckpoint(ModelCheckpointOptions("x").every_n_train_steps(-1)), c10::Error);
}

TEST(ModelCheckpointTest, KeepsTheLastKAndTheBestKByTheMonitoredMetric) {
  TempDir dir("ckpt_best");
  const fs::path root = dir.path / "ckpt";
  MarkerCheckpoint checkpoint(ModelCheckpointOptions(root.string())
                                  .every_n_train_steps(2).keep_last(1).monitor("val_loss").save_top_k(2));
  Trainer trainer = make_trainer();
  TinyModule module;
  const std::map<int64_t, double> val = {{2, 2.0}, {3, 1.0}, {4, 1.5}, {6, 3.0}, {8, 2.5}};
  for (int64_t step = 1; step <= 8; ++step) {
    if (val.count(step)) checkpoint.on_validation_end(trainer, module, val_metrics(step, val.at(step)));
    checkpoint.on_train_step_end(trainer, module, step);
  }
  // Saved: periodic 2, 4, 6, 8 and step 3 (its score entered the top 2).
  ASSERT_EQ(checkpoint.written.size(), 5u);
  EXPECT_EQ(checkpoint.written[1], (root / ".step-3.tmp").string());
  // Kept: the newest (8) and the best two (3: 1.0, 4: 1.5); 2 and 6 pruned.
  EXPECT_EQ(find_checkpoints(root.string()),
            (std::vector<std::string>{(root / "step-3").string(), (root / "step-4").string(),
                                      (root / "step-8").string()}));
  EXPECT_EQ(checkpoint.best(), (std::vector<std::pair<double, int64_t>>{{1.0, 3}, {1.5, 4}}));
  EXPECT_EQ(read_text(root / "best"), "step-3\n");
  EXPECT_TRUE(checkpoint.warnings().empty());

  // The state survives a resume (and a smaller k keeps the best of it).
  ModelCheckpoint restored(ModelCheckpointOptions(root.string()).monitor("val_loss").save_top_k(1));
  restored.load_state_dict(checkpoint.state_dict());
  EXPECT_EQ(restored.best(), (std::vector<std::pair<double, int64_t>>{{1.0, 3}}));
  EXPECT_EQ(restored.last_saved_step(), 8);
  EXPECT_THROW(restored.load_state_dict("nonsense"), c10::Error);

  // mode max: the highest scores are the best.
  MarkerCheckpoint highest(ModelCheckpointOptions((dir.path / "max").string())
                               .keep_last(1).monitor("loss").mode(MonitorMode::kMax).save_top_k(1));
  for (int64_t step = 1; step <= 3; ++step) {
    highest.on_train_batch_end(trainer, module, step_metrics(step, 1, 1.0, /*loss=*/step == 2 ? 9.0 : 1.0));
    highest.on_train_step_end(trainer, module, step);
  }
  EXPECT_EQ(highest.written.size(), 2u);  // steps 1 and 2; 3 does not beat 9
  EXPECT_EQ(highest.best(), (std::vector<std::pair<double, int64_t>>{{9.0, 2}}));
}

TEST(ModelCheckpointTest, WarnsOnceWhenTheMonitoredMetricIsNeverMeasured) {
  TempDir dir("ckpt_warn");
  Trainer trainer = make_trainer();
  TinyModule module;
  MarkerCheckpoint accuracy(ModelCheckpointOptions(dir.path.string()).monitor("val_accuracy").mode(MonitorMode::kMax));
  accuracy.on_validation_end(trainer, module, val_metrics(1, 1.0));  // no accuracy in it
  accuracy.on_validation_end(trainer, module, val_metrics(2, 1.0));
  accuracy.on_fit_end(trainer, module);
  ASSERT_EQ(accuracy.warnings().size(), 1u);
  EXPECT_NE(accuracy.warnings()[0].find("reported none"), std::string::npos) << accuracy.warnings()[0];
  EXPECT_TRUE(accuracy.written.empty());
  MarkerCheckpoint no_validation(ModelCheckpointOptions(dir.path.string()).monitor("val_loss"));
  no_validation.on_train_step_end(trainer, module, 1);
  no_validation.on_fit_end(trainer, module);
  ASSERT_EQ(no_validation.warnings().size(), 1u);
  EXPECT_NE(no_validation.warnings()[0].find("never measured"), std::string::npos) << no_validation.warnings()[0];
  MarkerCheckpoint unmonitored(ModelCheckpointOptions(dir.path.string()));
  unmonitored.on_fit_end(trainer, module);
  EXPECT_TRUE(unmonitored.warnings().empty());
  EXPECT_THROW(ModelCheckpoint(ModelCheckpointOptions("x").monitor("step_time_s")), c10::Error);
  EXPECT_THROW(ModelCheckpoint(ModelCheckpointOptions("x").monitor("val_loss").save_top_k(0)), c10::Error);
}

TEST(ThroughputTest, PeakFlopsProbeLeavesTheDefaultGeneratorAlone) {
  // Training draws its dropout masks from it; a resume restores its state.
  torch::manual_seed(1);
  const auto expected = torch::rand({4});
  torch::manual_seed(1);
  EXPECT_GT(measure_matmul_peak_flops(16, 1), 0.0);
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
}

// ---- all of them in a real fit() ---------------------------------------------

TEST(CallbacksFitTest, RealFitLogsCheckpointsAndResumes) {
  TempDir dir("fit");
  std::ostringstream progress_out;
  auto progress = std::make_shared<ProgressBar>(ProgressBarOptions().mode(ProgressMode::kPlain), progress_out);
  auto csv = std::make_shared<CsvLogger>(CsvLoggerOptions(dir.path.string()));
  auto throughput = std::make_shared<Throughput>(ThroughputOptions().peak_flops(1e9));
  auto memory = std::make_shared<MemoryMonitor>();
  auto checkpoint = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions((dir.path / "ckpt").string()).every_n_train_steps(2).keep_last(2));
  auto stopper = std::make_shared<EarlyStopping>();
  auto lr = std::make_shared<LrMonitor>();
  const auto options = TrainerOptions().max_steps(5).batch_size(4).log_every_n_steps(2).limit_val_batches(2);
  {
    Trainer trainer(options, std::make_shared<SingleDeviceStrategy>(),
                    {progress, csv, throughput, memory, checkpoint, stopper, lr});
    TinyModule module;
    CountingData data;
    const FitResult result = trainer.fit(module, data);
    EXPECT_EQ(result.steps, 5);
    EXPECT_FALSE(result.stopped_early) << result.stop_reason;
  }
  // Checkpoints at 2 and 4, the last at 5; the oldest pruned.
  const fs::path ckpt = dir.path / "ckpt";
  ASSERT_EQ(find_checkpoints(ckpt.string()),
            (std::vector<std::string>{(ckpt / "step-4").string(), (ckpt / "step-5").string()}));
  EXPECT_TRUE(fs::exists(ckpt / "step-5" / "metadata.json"));
  EXPECT_TRUE(fs::exists(ckpt / "step-5" / "full.bin"));  // single's default format
  EXPECT_EQ(checkpoint->last_saved_step(), 5);
  // CSV: train rows at steps 2, 4, 5 and the validation row at 5.
  const std::string csv_text = read_text(dir.path / "metrics.csv");
  EXPECT_EQ(csv_text.substr(0, csv_text.find('\n')),
            "step,loss,lr,grad_norm,step_time_s,backward_s,grad_sync_s,tokens_per_s,samples_per_s,mfu,rss_peak_mib,"
            "val_loss,val_accuracy")  // no MemoryTracker: no mem_* columns
      << csv_text;
  EXPECT_EQ(csv->num_rows(), 4);
  EXPECT_NE(progress_out.str().find("step 2/5 | loss "), std::string::npos) << progress_out.str();
  EXPECT_NE(progress_out.str().find("validation step 5 | val_loss "), std::string::npos);
  EXPECT_GT(throughput->average_tokens_per_s(), 0.0);
  EXPECT_GT(throughput->mfu(), 0.0);
  ASSERT_TRUE(memory->model_state().has_value());
  EXPECT_EQ(memory->model_state()->params, (16 * 8 + 8 * 16 + 16) * 4);
  EXPECT_EQ(memory->model_state()->grads, memory->model_state()->params);
  EXPECT_EQ(memory->model_state()->optimizer, 2 * memory->model_state()->params);
  EXPECT_NE(memory->summary().find("model state: params "), std::string::npos);

  // Resume from the newest checkpoint and run one more step.
  Trainer resumed(TrainerOptions(options).max_steps(6).resume_from(latest_checkpoint(ckpt.string())),
                  std::make_shared<SingleDeviceStrategy>());
  TinyModule module;
  CountingData data;
  EXPECT_EQ(resumed.fit(module, data).steps, 6);
}

}  // namespace
}  // namespace strata
