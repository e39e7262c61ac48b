#include "tests/builtin_models.h"
#include "tests/builtin_strategies.h"
#include "strata/recipes/config/cli.h"
#include "strata/recipes/app/run.h"
#include "strata/strategies/single/single_device.h"
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/recipes/models/spec.h"
#include "strata/kernels/fused_adamw_optimizer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

using strata::recipes::parse_run_config;
using strata::recipes::ParseResult;
using strata::recipes::RunConfig;
namespace fs = std::filesystem;

const strata::StrategyRegistry& builtins() { return strata::testing::builtin_strategies(); }

const strata::recipes::ModelKeys& model_keys() { return strata::testing::builtin_model_keys(); }

std::string to_ini(const RunConfig& c) { return strata::recipes::to_ini(c, model_keys(), builtins()); }

/// A strategy for registries of the tests' own: one process.
std::unique_ptr<strata::Strategy> registry_builtin_single(strata::Comm comm) {
  return std::make_unique<strata::SingleDeviceStrategy>(std::move(comm));
}

/// The strategy's resolved options (given or default).
strata::StrategyArgs args_of(const RunConfig& c) { return strata::recipes::strategy_args(c, builtins()); }

ParseResult parse(std::vector<std::string> args) {
  args.insert(args.begin(), "strata-gpt");
  return parse_run_config(args, model_keys(), builtins());
}

/// A file in a fresh temp directory, removed with it.
class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    dir_ = fs::temp_directory_path() /
           ("strata_cli_test_" + std::to_string(reinterpret_cast<uintptr_t>(this)) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    std::ofstream(path()) << text;
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path() const { return (dir_ / "run.ini").string(); }

 private:
  fs::path dir_;
};

/// exit_code 2, no config, a one-line message containing every `parts`.
void expect_error(const std::vector<std::string>& args, const std::vector<std::string>& parts) {
  const ParseResult result = parse(args);
  std::string joined;
  for (const auto& a : args) joined += a + " ";
  SCOPED_TRACE(joined);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_FALSE(result.config.has_value());
  EXPECT_EQ(result.message.find('\n'), std::string::npos) << result.message;
  for (const auto& part : parts) {
    EXPECT_NE(result.message.find(part), std::string::npos)
        << "message '" << result.message << "' lacks '" << part << "'";
  }
}

TEST(CliTest, DefaultsMatchRunConfig) {
  const ParseResult result = parse({});
  ASSERT_TRUE(result.config.has_value()) << result.message;
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(to_ini(*result.config), to_ini(RunConfig{}));
  EXPECT_EQ(result.config->preset, "gpt-micro");
  EXPECT_EQ(result.config->max_steps, 2500);
  EXPECT_TRUE(result.config->strategy_options.empty());  // every strategy option at its default
  RunConfig ddp = *result.config;
  ddp.strategy = "ddp";
  EXPECT_TRUE(args_of(ddp).boolean("overlap-comm"));
  EXPECT_FALSE(args_of(ddp).boolean("find-unused-parameters"));
}

TEST(CliTest, OverridesEveryKind) {
  const std::vector<std::string> args = {
      "--preset", "gpt-nano", "--n-layer", "2", "--n-head", "4", "--n-embd", "64",
      "--dropout", "-1", "--strategy", "fsdp", "--nproc", "4", "--master-port=29500",
      "--lr", "1e-3", "--min-lr", "0", "--seed", "18446744073709551615", "--precision",
      "bf16-mixed", "--output-dir", "out/x", "--max-steps", "7"};
  const ParseResult result = parse(args);
  ASSERT_TRUE(result.config.has_value()) << result.message;
  const RunConfig& c = *result.config;
  EXPECT_EQ(c.preset, "gpt-nano");
  EXPECT_EQ(c.model_options.at("n-layer"), "2");
  EXPECT_EQ(c.model_options.at("n-head"), "4");
  EXPECT_EQ(c.model_options.at("n-embd"), "64");
  EXPECT_EQ(c.model_options.at("dropout"), "-1");  // negative values may follow the key as a separate token
  EXPECT_EQ(c.strategy, "fsdp");
  EXPECT_EQ(c.nproc, 4);
  EXPECT_EQ(c.master_port, 29500);
  EXPECT_DOUBLE_EQ(c.lr, 1e-3);
  EXPECT_EQ(c.min_lr, 0.0);
  EXPECT_EQ(c.seed, 18446744073709551615ULL);
  EXPECT_EQ(c.precision, "bf16-mixed");
  EXPECT_EQ(c.output_dir, "out/x");
  EXPECT_EQ(c.max_steps, 7);
}

TEST(CliTest, AKeyGivenTwiceIsRefusedWhereverItIs) {
  // Either value may have been meant: refused, not "the last wins".
  expect_error({"--max-steps", "5", "--max-steps", "7"}, {"--max-steps is given twice; give it once"});
  expect_error({"--overlap-comm", "true", "--strategy", "ddp", "--overlap-comm=false"}, {"--overlap-comm is given twice"});
  TempFile file("max-steps = 10\nlr = 0.01\nmax-steps = 12\n");
  expect_error({"--config", file.path()}, {"config file '", "key 'max-steps' is given twice; give it once"});
  // The command line over the file is one value each: still fine.
  TempFile once("max-steps = 10\n");
  const ParseResult result = parse({"--config", once.path(), "--max-steps", "3"});
  ASSERT_TRUE(result.config.has_value()) << result.message;
  EXPECT_EQ(result.config->max_steps, 3);
}

TEST(CliTest, DataShapeKeysTheDataIgnoresAreRefusedAndWrittenAsComments) {
  expect_error({"--block-size", "64"}, {"--block-size would be ignored: addition data"});
  expect_error({"--data", "addition:4", "--vocab-size", "99"}, {"--vocab-size would be ignored"});
  const std::string text = (std::filesystem::temp_directory_path() / "strata-cli-text.txt").string();
  { std::ofstream(text) << "some text"; }
  expect_error({"--data", text, "--vocab-size", "99"}, {"is not a token directory"});
  const ParseResult ok = parse({"--data", text, "--block-size", "64"});
  ASSERT_TRUE(ok.config.has_value()) << ok.message;
  // config.ini of an addition run: the data's own sizes, commented out, so
  // the file is valid as --config again.
  RunConfig c;
  c.block_size = 11;
  c.vocab_size = 12;
  const std::string ini = to_ini(c);
  EXPECT_NE(ini.find("# block-size = 11  (not read: addition data"), std::string::npos) << ini;
  EXPECT_NE(ini.find("# vocab-size = 12  (not read: addition data"), std::string::npos) << ini;
  TempFile file(ini);
  const ParseResult again = parse({"--config", file.path()});
  EXPECT_TRUE(again.config.has_value()) << again.message;
  std::filesystem::remove(text);
  // A model from a checkpoint directory: the keys its config gave
  // (ModelConfig::source_keys) are commented out with the preset, the others kept.
  c.model_source = c.init_from = "/ckpt/qwen3";
  c.model_source_keys = {"n-layer", "n-embd"};
  c.model_options = {{"n-layer", "2"}, {"n-embd", "64"}, {"lora-rank", "4"}};
  const std::string from_dir = to_ini(c);
  EXPECT_NE(from_dir.find("# n-layer = 2  (given by init-from's config.json)"), std::string::npos) << from_dir;
  EXPECT_NE(from_dir.find("# n-embd = 64  (given by init-from's config.json)"), std::string::npos) << from_dir;
  EXPECT_NE(from_dir.find("\nlora-rank = 4\n"), std::string::npos) << from_dir;
}

TEST(CliTest, ScheduleAndValidationValuesThatWouldBeIgnoredAreRefused) {
  expect_error({"--comm-timeout", "0.0004"}, {"'0.0004'", "--comm-timeout", ">= 0.001 seconds"});
  expect_error({"--lr", "0.001", "--min-lr", "0.002"}, {"--min-lr 0.002 is above --lr 0.001"});
  expect_error({"--max-steps", "10", "--warmup-steps", "11"}, {"--warmup-steps 11 is above --max-steps 10"});
  expect_error({"--early-stopping-patience", "2", "--limit-val-batches", "0"}, {"needs periodic validation"});
  expect_error({"--early-stopping-patience", "2", "--val-check-interval", "0"}, {"needs periodic validation"});
  // Defaults adapt instead: min-lr (1e-4) is capped at a smaller --lr, the
  // default warmup (100) outlasts a short run.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--lr", "5e-5"}, {"--max-steps", "10"}, {"--min-lr", "1e-3", "--lr", "1e-3"},
        {"--max-steps", "10", "--warmup-steps", "10"}, {"--comm-timeout", "0.001"}}) {
    const ParseResult r = parse(args);
    EXPECT_TRUE(r.config.has_value()) << r.message;
  }
}

TEST(CliTest, ConfigFileThenCommandLine) {
  TempFile file("# a comment\nmax-steps = 10\nstrategy = ddp\nlr = 0.01\nresume =\n");
  const ParseResult result = parse({"--max-steps", "3", "--config", file.path(), "--seed", "7"});
  ASSERT_TRUE(result.config.has_value()) << result.message;
  EXPECT_EQ(result.config->max_steps, 3);  // command line wins, wherever --config is
  EXPECT_EQ(result.config->strategy, "ddp");
  EXPECT_DOUBLE_EQ(result.config->lr, 0.01);
  EXPECT_EQ(result.config->seed, 7u);
  EXPECT_EQ(result.config->resume, "");
  EXPECT_EQ(result.config->batch_size, RunConfig{}.batch_size);
}

TEST(CliTest, BadValueTypesNameTheValue) {
  expect_error({"--max-steps", "abc"}, {"'abc'", "--max-steps", "integer"});
  expect_error({"--lr", "fast"}, {"'fast'", "--lr", "number"});
  expect_error({"--lr", "nan"}, {"'nan'", "--lr"});
  expect_error({"--seed", "-1"}, {"'-1'", "--seed", "non-negative"});
  expect_error({"--nproc", "99999999999"}, {"'99999999999'", "--nproc"});
  expect_error({"--overlap-comm", "maybe"}, {"'maybe'", "--overlap-comm", "true"});
  expect_error({"--max-steps"}, {"missing value for --max-steps"});
  expect_error({"--max-steps="}, {"missing value for --max-steps"});
}

TEST(CliTest, OutOfRangeValuesNameTheValueAndTheRule) {
  // "--key value": each breaks exactly one rule.
  for (const std::string arg :
       {"--max-steps 0", "--batch-size -2", "--accumulate-grad-batches 0", "--lr 0",
        "--min-lr -0.5", "--warmup-steps -1", "--weight-decay -0.25", "--gradient-clip-val -3",
        "--nproc 0", "--threads-per-rank -4", "--master-port 70000", "--master-port -5",
        "--comm-timeout 0", "--n-layer -1", "--n-head -2", "--n-embd -3",
        "--block-size -8", "--dropout 1", "--dropout 1.5", "--log-every-n-steps 0",
        "--val-check-interval -1", "--limit-val-batches -1", "--checkpoint-every -10",
        "--early-stopping-patience -2", "--vocab-size 0"}) {
    const std::string key = arg.substr(0, arg.find(' ')), value = arg.substr(arg.find(' ') + 1);
    expect_error({key, value}, {"'" + value + "'", key, "must be"});
    expect_error({key + "=" + value}, {"'" + value + "'", key, "must be"});
  }
  // Strategy-specific: checked where it applies.
  expect_error({"--strategy", "ddp", "--bucket-cap-mb", "-25"}, {"'-25'", "--bucket-cap-mb", "must be"});
  expect_error({"--strategy", "oss", "--bucket-cap-mb=-25"}, {"'-25'", "--bucket-cap-mb", "must be"});
}

TEST(CliTest, BucketCapZeroIsForDdpOnly) {
  // ddp: 0 means one all-reduce per gradient; the sharded strategies need a round size.
  auto ddp = parse({"--strategy", "ddp", "--bucket-cap-mb", "0"});
  ASSERT_TRUE(ddp.config.has_value()) << ddp.message;
  EXPECT_EQ(args_of(*ddp.config).real("bucket-cap-mb"), 0.0);
  expect_error({"--strategy", "oss", "--bucket-cap-mb", "0"}, {"'0'", "--bucket-cap-mb", "strategy 'oss'", "> 0"});
  expect_error({"--strategy", "sdp", "--bucket-cap-mb", "0"}, {"'0'", "--bucket-cap-mb", "strategy 'sdp'", "> 0"});
}

TEST(CliTest, StrategySpecificOptionGivenToAnotherStrategyIsAnError) {
  // Each would be silently ignored: the error names the option, the strategy
  // given and the strategies that read it.
  expect_error({"--strategy", "oss", "--overlap-comm", "false"},
               {"--overlap-comm", "strategy 'oss'", "ddp only"});
  expect_error({"--strategy", "zero2", "--overlap-comm=true"},  // even restating the default
               {"--overlap-comm", "strategy 'zero2'", "ddp only"});
  expect_error({"--overlap-comm", "false"}, {"--overlap-comm", "strategy 'single'", "ddp only"});
  expect_error({"--find-unused-parameters"},
               {"--find-unused-parameters", "strategy 'single'",
                "ddp, oss (zero1), sdp (zero2) and fsdp (zero3)"});
  expect_error({"--bucket-cap-mb", "0"}, {"--bucket-cap-mb", "strategy 'single'", "ddp, oss"});
  expect_error({"--bucket-cap-mb", "25", "--strategy", "single"}, {"--bucket-cap-mb", "'single'"});
  // Where they apply, they are accepted (aliases too).
  for (const std::vector<std::string>& ok :
       {std::vector<std::string>{"--strategy", "ddp", "--overlap-comm", "false", "--bucket-cap-mb", "0",
                                 "--find-unused-parameters"},
        {"--strategy", "oss", "--find-unused-parameters", "--bucket-cap-mb", "1"},
        {"--strategy", "zero1", "--bucket-cap-mb", "1"},
        {"--strategy", "sdp", "--find-unused-parameters=true"},
        {"--strategy", "zero2", "--bucket-cap-mb", "2"},
        {"--strategy", "fsdp", "--find-unused-parameters"},
        {"--strategy", "zero3", "--find-unused-parameters=true"}}) {
    const ParseResult result = parse(ok);
    EXPECT_TRUE(result.config.has_value()) << ok[1] << ": " << result.message;
  }
  // Not given at all: the defaults are fine for every strategy.
  for (const std::string strategy : {"single", "ddp", "oss", "sdp"}) {
    EXPECT_TRUE(parse({"--strategy", strategy}).config.has_value()) << strategy;
  }
  // A config file's keys count as given; the command line's strategy is the one checked.
  TempFile ddp_file("strategy = ddp\noverlap-comm = false\n");
  EXPECT_TRUE(parse({"--config", ddp_file.path()}).config.has_value());
  expect_error({"--config", ddp_file.path(), "--strategy", "sdp"},
               {ddp_file.path(), "overlap-comm", "strategy 'sdp'", "ddp only"});
}

TEST(CliTest, ConfigIniOfEveryStrategyIsValidConfig) {
  // to_ini comments out the strategy-specific keys its strategy does not read,
  // so config.ini is usable as --config; and it says they were unused.
  for (const std::string strategy : {"single", "ddp", "oss", "sdp", "zero1"}) {
    RunConfig c;
    c.strategy = strategy;
    const std::string ini = to_ini(c);
    TempFile file(ini);
    const ParseResult result = parse({"--config", file.path()});
    ASSERT_TRUE(result.config.has_value()) << strategy << ": " << result.message << "\n" << ini;
    EXPECT_EQ(to_ini(*result.config), ini) << strategy;
    const bool is_ddp = strategy == "ddp";
    EXPECT_EQ(ini.find("\noverlap-comm = true\n") != std::string::npos, is_ddp) << ini;
    EXPECT_EQ(ini.find("# overlap-comm = true  (not used by strategy '" + strategy + "'") != std::string::npos,
              !is_ddp) << ini;
    EXPECT_EQ(ini.find("\nbucket-cap-mb = 25\n") != std::string::npos, strategy != "single") << ini;
  }
}

TEST(CliTest, OptimizerChoice) {
  EXPECT_EQ(parse({}).config->optimizer, "adamw");
  auto sgd = parse({"--optimizer", "sgd"});
  ASSERT_TRUE(sgd.config.has_value()) << sgd.message;
  EXPECT_EQ(sgd.config->optimizer, "sgd");
  EXPECT_NE(to_ini(*sgd.config).find("\noptimizer = sgd\n"), std::string::npos);
  expect_error({"--optimizer", "adam"}, {"unknown optimizer 'adam'", "available: adamw, sgd"});
  expect_error({"--optimizer", "SGD"}, {"'SGD'", "adamw, sgd"});
}

TEST(CliTest, AUsersStrategyGetsItsOptionsHelpAndConfigIni) {
  // A strategy registered from outside strata: its options are flags, INI
  // keys and --help lines like the built-ins', and are refused elsewhere.
  strata::StrategyRegistry registry;
  strata::register_builtin_strategies(registry);
  registry.add(strata::StrategySpec("toy", "a user's strategy")
                   .options({strata::StrategyOption::integer("sync-every", 8, "steps between averages").at_least(1)})
                   .factory([](strata::Comm comm, const strata::StrategyArgs&, const strata::StrategyContext&) {
                     return registry_builtin_single(std::move(comm));
                   }));
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "strata-gpt");
    return parse_run_config(args, model_keys(), registry);
  };
  const auto toy = run({"--strategy", "toy", "--sync-every", "3"});
  ASSERT_TRUE(toy.config.has_value()) << toy.message;
  EXPECT_EQ(strata::recipes::strategy_args(*toy.config, registry).integer("sync-every"), 3);
  const std::string ini = strata::recipes::to_ini(*toy.config, model_keys(), registry);
  EXPECT_NE(ini.find("\nsync-every = 3\n"), std::string::npos) << ini;
  EXPECT_NE(ini.find("# bucket-cap-mb = 25  (not used by strategy 'toy'"), std::string::npos) << ini;
  const auto elsewhere = run({"--strategy", "ddp", "--sync-every", "3"});
  EXPECT_EQ(elsewhere.exit_code, 2);
  EXPECT_NE(elsewhere.message.find("--sync-every does not apply to strategy 'ddp' (it would be ignored); it is for toy only"),
            std::string::npos)
      << elsewhere.message;
  const auto bad = run({"--strategy", "toy", "--sync-every", "0"});
  EXPECT_NE(bad.message.find("invalid value '0' for --sync-every: must be >= 1 for strategy 'toy'"), std::string::npos)
      << bad.message;
  const auto help = run({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.message.find("  toy                   a user's strategy"), std::string::npos) << help.message;
  EXPECT_NE(help.message.find("--sync-every INT (=8)"), std::string::npos) << help.message;
  EXPECT_NE(help.message.find("[toy only] steps between averages"), std::string::npos) << help.message;
}

TEST(CliTest, AUsersModelFamilyBringsItsOwnKeys) {
  // A family's declared options become strata-gpt keys like the built-ins':
  // parsed by kind, refused by the declared rule, listed in --help with the
  // families that read them, written to config.ini.
  strata::recipes::ModelRegistry models;
  strata::recipes::register_builtin_models(models);
  models.add(strata::recipes::ModelSpec("toy-lm", "a user's model")
                 .presets({"toy-lm-small"})
                 .options({strata::recipes::ModelOption::integer("hidden", 16, "hidden width").at_least(1),
                           strata::recipes::ModelOption::integer("n-layer", 0, "toy layers (0: the preset's)")})
                 .factory([](const strata::recipes::ModelRequest&) -> strata::recipes::ModelPtr { return nullptr; }));
  const auto keys = strata::recipes::cli_keys(models);
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "strata-gpt");
    return parse_run_config(args, keys, builtins());
  };
  const auto toy = run({"--preset", "toy-lm-small", "--hidden", "32"});
  ASSERT_TRUE(toy.config.has_value()) << toy.message;
  EXPECT_EQ(toy.config->model_options.at("hidden"), "32");
  EXPECT_NE(strata::recipes::to_ini(*toy.config, keys, builtins()).find("\nhidden = 32\n"), std::string::npos);
  const auto bad = run({"--preset", "toy-lm-small", "--hidden", "0"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.message, "invalid value '0' for --hidden: must be >= 1") << bad.message;
  const auto help = run({"--help"});
  EXPECT_NE(help.message.find("[toy-lm] hidden width"), std::string::npos) << help.message;
  // --help wraps its lines: the families' tag, then each family's own words.
  EXPECT_NE(help.message.find("[gpt, llama, toy-lm] gpt, llama: transformer blocks"), std::string::npos) << help.message;
  EXPECT_NE(help.message.find("toy-lm: toy layers"), std::string::npos) << help.message;
  // The family that resolves the model refuses a key it does not declare.
  strata::recipes::ModelRequest undeclared;
  undeclared.preset = "gpt-micro";
  undeclared.options = {{"hidden", "32"}};
  undeclared.vocab_size = 16;
  undeclared.block_size = 8;
  EXPECT_THROW(models.resolve(undeclared), c10::ValueError);
  // One key, one kind; and no model key may shadow strata-gpt's own or a strategy's.
  strata::recipes::ModelRegistry clash;
  strata::recipes::register_builtin_models(clash);
  EXPECT_THROW(clash.add(strata::recipes::ModelSpec("real-layers", "")
                             .presets({"real-layers-1"})
                             .options({strata::recipes::ModelOption::real("n-layer", 1.5, "")})
                             .factory([](const strata::recipes::ModelRequest&) { return nullptr; })),
               c10::ValueError);
  clash.add(strata::recipes::ModelSpec("own-lr", "")
                .presets({"own-lr-1"})
                .options({strata::recipes::ModelOption::real("lr", 0.1, "")})
                .factory([](const strata::recipes::ModelRequest&) { return nullptr; }));
  const auto shadow = parse_run_config({"strata-gpt"}, strata::recipes::cli_keys(clash), builtins());
  EXPECT_EQ(shadow.exit_code, 2);
  EXPECT_NE(shadow.message.find("model option '--lr' (declared by own-lr) is one of strata-gpt's own options"),
            std::string::npos)
      << shadow.message;
}

TEST(CliTest, AStrategyMayNotTakeStrataGptsOwnKeysOrAuto) {
  // One key, one meaning: a strategy option named like one of strata-gpt's
  // (or a strategy named auto) would leave one of the two without its value.
  const auto parse_with = [](const strata::StrategyRegistry& registry) {
    return parse_run_config({"strata-gpt", "--max-steps", "3"}, model_keys(), registry);
  };
  const auto factory = [](strata::Comm comm, const strata::StrategyArgs&, const strata::StrategyContext&) {
    return registry_builtin_single(std::move(comm));
  };
  strata::StrategyRegistry clash;
  strata::register_builtin_strategies(clash);
  clash.add(strata::StrategySpec("heavy-ball", "momentum of its own")
                .options({strata::StrategyOption::real("momentum", 0.5, "outer momentum")})
                .factory(factory));
  const auto refused = parse_with(clash);
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.message.find("strategy option '--momentum' (declared by heavy-ball only) is one of strata-gpt's own"),
            std::string::npos)
      << refused.message;
  strata::StrategyRegistry named_auto;
  named_auto.add(strata::StrategySpec("auto", "a strategy called auto").factory(factory));
  EXPECT_NE(parse_with(named_auto).message.find("registered as 'auto'"), std::string::npos);
}

TEST(CliTest, OptimizerHyperparametersReachTheTrainer) {
  auto adamw = parse({"--adam-beta1", "0.8", "--adam-beta2", "0.999", "--adam-eps", "1e-6"});
  ASSERT_TRUE(adamw.config.has_value()) << adamw.message;
  const auto o = strata::recipes::trainer_options(*adamw.config);
  EXPECT_EQ(o.beta1(), 0.8);
  EXPECT_EQ(o.beta2(), 0.999);
  EXPECT_EQ(o.eps(), 1e-6);
  EXPECT_NE(to_ini(*adamw.config).find("\nadam-beta1 = 0.8\n"), std::string::npos) << to_ini(*adamw.config);
  // The defaults are nanoGPT's.
  EXPECT_EQ(strata::recipes::trainer_options(RunConfig{}).beta2(), 0.95);
  auto sgd = parse({"--optimizer", "sgd", "--momentum", "0.9", "--nesterov"});
  ASSERT_TRUE(sgd.config.has_value()) << sgd.message;
  const auto s = strata::recipes::trainer_options(*sgd.config);
  EXPECT_EQ(s.momentum(), 0.9);
  EXPECT_TRUE(s.nesterov());
  // Each optimizer's options are for it only; config.ini comments out the other's.
  expect_error({"--optimizer", "sgd", "--adam-beta1", "0.8"}, {"--adam-beta1", "optimizer 'sgd'", "adamw only"});
  expect_error({"--momentum", "0.9"}, {"--momentum", "optimizer 'adamw'", "sgd only"});
  expect_error({"--optimizer", "sgd", "--nesterov"}, {"--nesterov needs a momentum"});
  expect_error({"--adam-beta2", "1"}, {"'1'", "--adam-beta2", "in [0, 1)"});
  expect_error({"--adam-eps", "0"}, {"'0'", "--adam-eps", "> 0"});
  expect_error({"--optimizer", "sgd", "--momentum", "-0.1"}, {"'-0.1'", "--momentum", "in [0, 1)"});
  expect_error({"--optimizer", "sgd", "--momentum", "0.9", "--offload", "disk"}, {"--offload disk", "--momentum 0.9"});
  const std::string sgd_ini = to_ini(*sgd.config);
  EXPECT_NE(sgd_ini.find("# adam-beta1 = 0.9  (not used by optimizer 'sgd'; it is for adamw)"), std::string::npos)
      << sgd_ini;
  EXPECT_NE(sgd_ini.find("\nmomentum = 0.9\nnesterov = true\n"), std::string::npos) << sgd_ini;
  TempFile file(sgd_ini);
  const ParseResult again = parse({"--config", file.path()});
  ASSERT_TRUE(again.config.has_value()) << again.message;
  EXPECT_EQ(to_ini(*again.config), sgd_ini);
}

TEST(CliTest, ActivationCheckpointingPolicy) {
  EXPECT_EQ(parse({}).config->activation_checkpointing, 0);  // off by default
  auto every2 = parse({"--activation-checkpointing", "2", "--strategy", "oss"});
  ASSERT_TRUE(every2.config.has_value()) << every2.message;  // every strategy takes it
  EXPECT_EQ(every2.config->activation_checkpointing, 2);
  EXPECT_NE(to_ini(*every2.config).find("\nactivation-checkpointing = 2\n"), std::string::npos);
  expect_error({"--activation-checkpointing", "-1"},
               {"'-1'", "--activation-checkpointing", ">= 0 (0: off, n: every n-th block)"});
  // What a checkpointed block keeps: full by default, or a selective policy.
  EXPECT_EQ(parse({}).config->ac_policy, "full");
  auto op = parse({"--activation-checkpointing", "1", "--ac-policy", "op"});
  ASSERT_TRUE(op.config.has_value()) << op.message;
  EXPECT_EQ(op.config->ac_policy, "op");
  EXPECT_NE(to_ini(*op.config).find("\nac-policy = op\n"), std::string::npos);
  expect_error({"--activation-checkpointing", "1", "--ac-policy", "some"},
               {"unknown ac-policy 'some'", "full, attention, op"});
  // Without checkpointed blocks it would be ignored.
  expect_error({"--ac-policy", "attention"}, {"--ac-policy attention", "add --activation-checkpointing N"});
}

TEST(CliTest, CheckpointFormat) {
  EXPECT_EQ(parse({}).config->checkpoint_format, "auto");  // sharded for oss/sdp/fsdp, else full
  for (const std::string f : {"full", "sharded"}) EXPECT_EQ(parse({"--checkpoint-format", f}).config->checkpoint_format, f);
  expect_error({"--checkpoint-format", "zip"}, {"unknown checkpoint-format 'zip'", "auto, full, sharded"});
}

TEST(CliTest, FsdpOptions) {
  auto fsdp = parse({"--strategy", "fsdp", "--nproc", "2", "--sharding-strategy", "shard_grad_op",
                     "--limit-all-gathers", "false", "--wrap-policy", "none"});
  ASSERT_TRUE(fsdp.config.has_value()) << fsdp.message;
  const auto fsdp_args = args_of(*fsdp.config);
  EXPECT_EQ(fsdp_args.text("sharding-strategy"), "shard_grad_op");
  EXPECT_FALSE(fsdp_args.boolean("limit-all-gathers"));
  EXPECT_EQ(fsdp_args.text("wrap-policy"), "none");
  EXPECT_EQ(fsdp_args.text("reshard-after-forward"), "auto");
  EXPECT_TRUE(parse({"--strategy", "zero3", "--nproc", "2", "--reshard-after-forward", "false"}).config);
  expect_error({"--strategy", "fsdp", "--sharding-strategy", "hybrid"},
               {"invalid value 'hybrid' for --sharding-strategy", "full_shard, shard_grad_op, no_shard"});
  expect_error({"--strategy", "fsdp", "--reshard-after-forward", "yes"}, {"'yes'", "auto, true, false"});
  expect_error({"--strategy", "fsdp", "--wrap-policy", "layer"}, {"'layer'", "block, none"});
  auto reduce = parse({"--strategy", "fsdp", "--precision", "bf16-mixed", "--reduce-dtype", "bf16"});
  ASSERT_TRUE(reduce.config.has_value()) << reduce.message;
  EXPECT_EQ(args_of(*reduce.config).text("reduce-dtype"), "bf16");
  EXPECT_EQ(fsdp_args.text("reduce-dtype"), "fp32");
  expect_error({"--strategy", "fsdp", "--reduce-dtype", "fp16"}, {"'fp16'", "fp32, bf16"});
  expect_error({"--strategy", "fsdp", "--sharding-strategy", "no_shard", "--reduce-dtype", "bf16"},
               {"--reduce-dtype bf16 needs sharded gradients", "not no_shard"});
  expect_error({"--strategy", "ddp", "--reduce-dtype", "bf16"}, {"--reduce-dtype", "strategy 'ddp'", "fsdp (zero3) only"});
  expect_error({"--strategy", "fsdp", "--sharding-strategy", "no_shard", "--reshard-after-forward", "true"},
               {"--reshard-after-forward true contradicts --sharding-strategy no_shard"});
  // FSDP's options given to another strategy would be ignored: bad input.
  expect_error({"--strategy", "ddp", "--sharding-strategy", "no_shard"},
               {"--sharding-strategy does not apply to strategy 'ddp'", "fsdp (zero3) only"});
  expect_error({"--wrap-policy", "none"}, {"--wrap-policy does not apply to strategy 'single'"});
}

TEST(CliTest, AttentionChoice) {
  EXPECT_EQ(parse({}).config->model_options.count("attention"), 0u);
  EXPECT_NE(to_ini(*parse({}).config).find("\nattention = fused\n"), std::string::npos);  // the families' default
  auto naive = parse({"--attention", "naive"});
  ASSERT_TRUE(naive.config.has_value()) << naive.message;
  EXPECT_EQ(naive.config->model_options.at("attention"), "naive");
  EXPECT_NE(to_ini(*naive.config).find("attention = naive"), std::string::npos) << to_ini(*naive.config);
  expect_error({"--attention", "flash"}, {"invalid value 'flash' for --attention", "one of fused, sdpa, naive"});
  TempFile file("attention = flash\n");
  expect_error({"--config", file.path()}, {"invalid value 'flash' for attention", "one of fused, sdpa, naive"});
  // Every attention the GPT implements is selectable from the command line
  // (the parser's list once missed sdpa).
  for (const auto& name : strata::recipes::attention_names()) {
    auto chosen = parse({"--attention", name});
    ASSERT_TRUE(chosen.config.has_value()) << name << ": " << chosen.message;
    EXPECT_EQ(chosen.config->model_options.at("attention"), name);
  }
}

TEST(CliTest, HybridShardIsAShardingStrategy) {
  auto hybrid = parse({"--strategy", "fsdp", "--nproc", "2", "--nnodes", "2", "--master-port", "29999",
                       "--sharding-strategy", "hybrid_shard", "--reshard-after-forward", "true"});
  ASSERT_TRUE(hybrid.config.has_value()) << hybrid.message;
  EXPECT_EQ(args_of(*hybrid.config).text("sharding-strategy"), "hybrid_shard");
  expect_error({"--strategy", "fsdp", "--sharding-strategy", "hybrid"}, {"hybrid_shard"});
}

TEST(CliTest, UnknownChoicesListTheAlternatives) {
  expect_error({"--preset", "gpt-huge"}, {"unknown preset 'gpt-huge'", "gpt-nano", "gpt-micro"});
  expect_error({"--strategy", "zero9"}, {"unknown strategy 'zero9'", "ddp", "zero3"});
  expect_error({"--precision", "16"}, {"'16'", "32-true", "bf16-mixed"});
}

TEST(CliTest, TheModelsOwnRulesAreItsFamilys) {
  // The CLI knows no model's rules: a width the heads do not divide parses,
  // and the GPT family refuses it when the registry resolves the model (phase
  // 1: one line, exit 2, BadInputTest).
  const auto parsed = parse({"--n-embd", "100", "--n-head", "3"});
  ASSERT_TRUE(parsed.config.has_value()) << parsed.message;
  strata::recipes::ModelRegistry models;
  strata::recipes::register_builtin_models(models);
  strata::recipes::ModelRequest r;
  r.preset = "gpt-micro";
  r.options = {{"n-embd", "100"}, {"n-head", "3"}};
  r.vocab_size = 12;
  r.block_size = 11;
  try {
    models.resolve(r);
    ADD_FAILURE() << "n_embd 100 over 3 heads was accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("n_embd 100 is not divisible by n_head 3"),
              std::string::npos);
  }
}

TEST(CliTest, UnknownOptionAndStrayArguments) {
  expect_error({"--foo", "1"}, {"unknown option '--foo'", "--help"});
  expect_error({"--max", "1"}, {"'--max'"});  // no prefix guessing
  expect_error({"stray"}, {"'stray'"});
}

TEST(CliTest, ConfigFileErrors) {
  TempFile unknown("max-steps = 10\nfoo = 3\n");
  expect_error({"--config", unknown.path()},
               {unknown.path(), "unknown key 'foo'", "valid keys: preset, n-layer", "max-steps"});
  TempFile bad_value("max-steps = abc\n");
  expect_error({"--config", bad_value.path()}, {bad_value.path(), "'abc'", "max-steps"});
  TempFile bad_line("max-steps\n");
  expect_error({"--config", bad_line.path()}, {bad_line.path(), "max-steps"});
  TempFile out_of_range("batch-size = 0\n");
  expect_error({"--config", out_of_range.path()}, {"'0'", "batch-size"});
  const std::string missing = (fs::temp_directory_path() / "strata_cli_test_missing.ini").string();
  expect_error({"--config", missing}, {missing});
  expect_error({"--config", ""}, {"config file ''"});
  expect_error({"--config", fs::temp_directory_path().string()},
               {fs::temp_directory_path().string()});
}

TEST(CliTest, HelpPrintsGroupedUsage) {
  const ParseResult result = parse({"--max-steps", "5", "--help"});
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_FALSE(result.config.has_value());
  EXPECT_EQ(result.message.rfind("Usage: strata-gpt [options]", 0), 0u);
  for (const char* part :
       {"--strategy", "--config", "--progress-bar", "Model", "Data", "Strategy and launch",
        "Optimisation", "Loop and outputs", "2500", "gpt-nano"}) {
    EXPECT_NE(result.message.find(part), std::string::npos) << part;
  }
  EXPECT_EQ(parse({"-h"}).exit_code, 0);
}

TEST(CliTest, TestingAidsAreListedByHelpAllOnly) {
  const ParseResult help = parse({"--help"});
  const ParseResult all = parse({"--help-all"});
  ASSERT_EQ(help.exit_code, 0);
  ASSERT_EQ(all.exit_code, 0);
  for (const char* aid : {"--dump-params", "STRATA_TEST_FAIL_AT_STEP", "STRATA_TEST_FAIL_RANK", "Testing aids"}) {
    EXPECT_EQ(help.message.find(aid), std::string::npos) << aid << " in --help:\n" << help.message;
    EXPECT_NE(all.message.find(aid), std::string::npos) << aid << " not in --help-all:\n" << all.message;
  }
  // --help says where the rest is; --help-all is --help plus the aids.
  EXPECT_NE(help.message.find("--help-all"), std::string::npos);
  EXPECT_EQ(all.message.rfind(help.message, 0), 0u);
  // Still accepted: the tests use them.
  auto dump = parse({"--dump-params", "p.pt"});
  ASSERT_TRUE(dump.config.has_value()) << dump.message;
  EXPECT_EQ(dump.config->dump_params, "p.pt");
}

TEST(CliTest, BoolForms) {
  auto config = [](std::vector<std::string> args) {
    ParseResult result = parse(std::move(args));
    EXPECT_TRUE(result.config.has_value()) << result.message;
    return result.config.value_or(RunConfig{});
  };
  const auto flag = [&](std::vector<std::string> args, const std::string& key) {
    const RunConfig c = config(std::move(args));
    return args_of(c).boolean(key);
  };
  EXPECT_FALSE(flag({"--strategy", "ddp", "--overlap-comm", "false"}, "overlap-comm"));
  EXPECT_FALSE(flag({"--strategy=ddp", "--overlap-comm=0"}, "overlap-comm"));
  EXPECT_FALSE(flag({"--overlap-comm", "no", "--strategy", "ddp"}, "overlap-comm"));
  EXPECT_TRUE(flag({"--strategy", "ddp", "--find-unused-parameters"}, "find-unused-parameters"));
  EXPECT_TRUE(flag({"--find-unused-parameters", "--max-steps", "3", "--strategy", "ddp"}, "find-unused-parameters"));
  EXPECT_TRUE(flag({"--strategy", "ddp", "--find-unused-parameters", "yes"}, "find-unused-parameters"));
  EXPECT_TRUE(flag({"--strategy", "ddp", "--find-unused-parameters=1"}, "find-unused-parameters"));
  EXPECT_FALSE(config({"--progress-bar", "false"}).progress_bar);
  EXPECT_FALSE(config({"--progress-bar=no"}).progress_bar);
  EXPECT_TRUE(config({"--progress-bar"}).progress_bar);
  expect_error({"--overlap-comm"}, {"--overlap-comm"});  // not a bare flag
}

TEST(CliTest, IniRoundTrips) {
  RunConfig c;
  c.preset = "gpt-nano";
  c.model_options = {{"n-layer", "3"}, {"n-head", "2"}, {"n-embd", "48"}, {"dropout", "0.125"}};
  c.block_size = 17;
  c.data = std::filesystem::temp_directory_path().string();  // a directory: token data reads both sizes
  c.vocab_size = 1024;
  c.strategy = "ddp";  // reads every strategy-specific key below
  c.nproc = 2;
  c.threads_per_rank = 1;
  c.master_addr = "10.0.0.2";
  c.master_port = 29511;
  c.comm_timeout_s = 12.5;
  c.strategy_options = {{"bucket-cap-mb", "0.1"}, {"find-unused-parameters", "true"}, {"overlap-comm", "false"}};
  c.max_steps = 11;
  c.batch_size = 3;
  c.accumulate_grad_batches = 4;
  c.optimizer = "sgd";
  c.lr = 1.0 / 3.0;  // needs every digit to round-trip
  c.min_lr = 1e-7;
  c.warmup_steps = 0;
  c.weight_decay = 0.0;
  c.gradient_clip_val = 0.5;
  c.precision = "bf16-mixed";
  c.seed = 1ULL << 63;
  c.log_every_n_steps = 1;
  c.val_check_interval = 2;  // early stopping needs validation
  c.limit_val_batches = 1;
  c.output_dir = "runs/round trip";
  c.checkpoint_every = 5;
  c.checkpoint_keep = 7;
  c.checkpoint_format = "full";
  c.checkpoint_monitor = "val_accuracy";
  c.checkpoint_mode = "max";
  c.checkpoint_keep_best = 4;
  c.early_stopping_patience = 3;
  c.resume = "runs/old/step-5";
  c.dump_params = "params.pt";
  c.progress_bar = false;

  const std::string ini = to_ini(c);
  EXPECT_EQ(ini.rfind("# Model\npreset = gpt-nano\n", 0), 0u) << ini;
  EXPECT_NE(ini.find("# Strategy and launch\n"), std::string::npos);
  EXPECT_NE(ini.find("max-steps = 11\n"), std::string::npos);
  EXPECT_EQ(ini, to_ini(c));  // stable

  TempFile file(ini);
  const ParseResult result = parse({"--config", file.path()});
  ASSERT_TRUE(result.config.has_value()) << result.message;
  const RunConfig& r = *result.config;
  EXPECT_EQ(to_ini(r), ini);  // every field; doubles print in shortest round-trip form
  EXPECT_EQ(r.lr, c.lr);
  EXPECT_EQ(r.seed, c.seed);
  EXPECT_EQ(r.output_dir, c.output_dir);
  EXPECT_EQ(args_of(r).boolean("overlap-comm"), false);
  EXPECT_EQ(args_of(r).real("bucket-cap-mb"), 0.1);
  EXPECT_EQ(r.progress_bar, false);
  EXPECT_EQ(r.optimizer, "sgd");
  EXPECT_EQ(r.dump_params, "params.pt");

  TempFile defaults(to_ini(RunConfig{}));  // empty strings survive too
  const ParseResult plain = parse({"--config", defaults.path()});
  ASSERT_TRUE(plain.config.has_value()) << plain.message;
  EXPECT_EQ(to_ini(*plain.config), to_ini(RunConfig{}));
}

TEST(CliTest, CheckpointMonitorModeAndKeepBest) {
  const ParseResult plain = parse({});
  ASSERT_TRUE(plain.config.has_value()) << plain.message;
  EXPECT_EQ(plain.config->checkpoint_monitor, "");
  EXPECT_EQ(plain.config->checkpoint_mode, "min");
  EXPECT_EQ(plain.config->checkpoint_keep_best, 1);
  // Unused without a monitor: commented out in config.ini, so it stays valid --config.
  EXPECT_NE(to_ini(*plain.config).find("# checkpoint-mode = min  (not used without checkpoint-monitor)"),
            std::string::npos);
  const ParseResult given = parse({"--checkpoint-monitor", "val_accuracy", "--checkpoint-mode", "max",
                                   "--checkpoint-keep-best", "3", "--checkpoint-keep", "0"});
  ASSERT_TRUE(given.config.has_value()) << given.message;
  EXPECT_EQ(given.config->checkpoint_monitor, "val_accuracy");
  EXPECT_EQ(given.config->checkpoint_mode, "max");
  EXPECT_EQ(given.config->checkpoint_keep_best, 3);
  EXPECT_EQ(given.config->checkpoint_keep, 0);
  expect_error({"--checkpoint-monitor", "grad_norm"},
               {"unknown checkpoint-monitor 'grad_norm'; available: val_loss, val_accuracy, loss"});
  expect_error({"--checkpoint-monitor", "loss", "--checkpoint-mode", "up"},
               {"unknown checkpoint-mode 'up'; available: min, max"});
  expect_error({"--checkpoint-mode", "max"}, {"--checkpoint-mode applies only with --checkpoint-monitor"});
  expect_error({"--checkpoint-keep-best", "2"}, {"--checkpoint-keep-best applies only with --checkpoint-monitor"});
  expect_error({"--checkpoint-monitor", "loss", "--checkpoint-keep-best", "0"},
               {"'0'", "--checkpoint-keep-best", "must be >= 1"});
  expect_error({"--checkpoint-keep", "-1"}, {"'-1'", "--checkpoint-keep", "must be >= 0"});
}

TEST(CliTest, FusedAdamWFlagSelectsTheOptimizerAndOnlyAppliesToAdamW) {
  EXPECT_TRUE(parse({}).config->fused_adamw);  // default: fused
  const ParseResult off = parse({"--fused-adamw", "false"});
  ASSERT_TRUE(off.config.has_value()) << off.message;
  EXPECT_FALSE(off.config->fused_adamw);
  expect_error({"--fused-adamw", "maybe"}, {"'maybe'", "--fused-adamw"});
  // With sgd it would be ignored: an error naming both.
  expect_error({"--optimizer", "sgd", "--fused-adamw", "false"},
               {"--fused-adamw", "optimizer 'sgd'", "adamw only"});
  // config.ini round-trips, and comments the key out for sgd (so the file stays valid).
  RunConfig c;
  c.fused_adamw = false;
  TempFile file(to_ini(c));
  const ParseResult again = parse({"--config", file.path()});
  ASSERT_TRUE(again.config.has_value()) << again.message;
  EXPECT_FALSE(again.config->fused_adamw);
  c.optimizer = "sgd";
  const std::string sgd_ini = to_ini(c);
  EXPECT_NE(sgd_ini.find("# fused-adamw = false  (not used by optimizer 'sgd'"), std::string::npos) << sgd_ini;
  TempFile sgd_file(sgd_ini);
  const ParseResult sgd = parse({"--config", sgd_file.path()});
  ASSERT_TRUE(sgd.config.has_value()) << sgd.message;
  EXPECT_EQ(sgd.config->optimizer, "sgd");
}

TEST(CliTest, AdamWKernelFlagPicksStrataOrAtenAndNeedsTheFusedAdamW) {
  EXPECT_EQ(parse({}).config->adamw_kernel, "strata");
  const ParseResult aten = parse({"--adamw-kernel", "aten"});
  ASSERT_TRUE(aten.config.has_value()) << aten.message;
  EXPECT_EQ(aten.config->adamw_kernel, "aten");
  expect_error({"--adamw-kernel", "mkl"}, {"'mkl'", "adamw-kernel", "strata, aten"});
  // Every kernel FusedAdamW has is selectable (the parser keeps its own list).
  for (const auto& name : strata::fused_adamw_kernel_names()) {
    const ParseResult chosen = parse({"--adamw-kernel", name});
    ASSERT_TRUE(chosen.config.has_value()) << name << ": " << chosen.message;
    EXPECT_EQ(chosen.config->adamw_kernel, name);
  }
  expect_error({"--fused-adamw", "false", "--adamw-kernel", "aten"},
               {"--adamw-kernel", "--fused-adamw false", "ignored"});
  expect_error({"--optimizer", "sgd", "--adamw-kernel", "aten"}, {"--adamw-kernel", "optimizer 'sgd'"});
  // config.ini round-trips; with fused-adamw false the key is commented out, so the file stays valid.
  RunConfig c;
  c.adamw_kernel = "aten";
  TempFile file(to_ini(c));
  const ParseResult again = parse({"--config", file.path()});
  ASSERT_TRUE(again.config.has_value()) << again.message;
  EXPECT_EQ(again.config->adamw_kernel, "aten");
  c.fused_adamw = false;
  const std::string off_ini = to_ini(c);
  EXPECT_NE(off_ini.find("# adamw-kernel = aten  (not used with fused-adamw = false)"), std::string::npos) << off_ini;
  TempFile off_file(off_ini);
  const ParseResult off = parse({"--config", off_file.path()});
  ASSERT_TRUE(off.config.has_value()) << off.message;
  EXPECT_FALSE(off.config->fused_adamw);
}

}  // namespace

TEST(CliTest, MemoryBudgetAndNoMemoryCheck) {
  const auto with_auto = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "strata-gpt");
    return parse_run_config(args, model_keys(), builtins());
  };
  const auto ok = with_auto({"--strategy", "auto", "--memory-budget", "4GiB", "--no-memory-check"});
  ASSERT_TRUE(ok.config.has_value()) << ok.message;
  EXPECT_EQ(ok.config->memory_budget, "4GiB");
  EXPECT_TRUE(ok.config->no_memory_check);
  EXPECT_FALSE(RunConfig{}.no_memory_check);
  const auto bad = with_auto({"--strategy", "ddp", "--memory-budget", "4GiB"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.message.find("--memory-budget applies only with --strategy auto"), std::string::npos) << bad.message;
  expect_error({"--no-memory-check", "maybe"}, {"no-memory-check", "maybe"});
}

namespace {

TEST(CliTest, LossScalingOptionsAreFor16MixedOnly) {
  auto fp16 = parse({"--precision", "16-mixed", "--loss-scale-window", "200", "--hysteresis", "1",
                     "--min-loss-scale", "4", "--initial-scale-power", "12"});
  ASSERT_TRUE(fp16.config.has_value()) << fp16.message;
  EXPECT_EQ(fp16.config->loss_scale_window, 200);
  EXPECT_EQ(fp16.config->hysteresis, 1);
  EXPECT_EQ(fp16.config->min_loss_scale, 4.0);
  const std::string ini = to_ini(*fp16.config);
  EXPECT_NE(ini.find("\nhysteresis = 1\n"), std::string::npos) << ini;
  // bf16 and fp32 need no scaler: the options would be ignored.
  expect_error({"--precision", "bf16-mixed", "--loss-scale", "128"},
               {"--loss-scale would be ignored", "16-mixed", "bf16-mixed needs none"});
  expect_error({"--hysteresis", "1"}, {"--hysteresis would be ignored", "precision 32 needs none"});
  TempFile file("initial-scale-power = 8\n");
  expect_error({"--config", file.path()}, {"initial-scale-power would be ignored"});
  // So to_ini comments them out where they are not read.
  auto fp32 = parse({});
  ASSERT_TRUE(fp32.config.has_value());
  EXPECT_NE(to_ini(*fp32.config).find("# hysteresis = 2  (not read: loss scaling is for --precision 16-mixed"),
            std::string::npos)
      << to_ini(*fp32.config);
  // Ranges.
  expect_error({"--precision", "16-mixed", "--hysteresis", "0"}, {"'0' for --hysteresis", ">= 1"});
  expect_error({"--precision", "16-mixed", "--loss-scale", "-2"}, {"'-2' for --loss-scale", "[0, 2^63]"});
  expect_error({"--precision", "16-mixed", "--initial-scale-power", "64"}, {"'64' for --initial-scale-power"});
  expect_error({"--precision", "16-mixed", "--initial-scale-power", "2", "--min-loss-scale", "8"},
               {"'8' for --min-loss-scale", "at most the initial scale 2^2"});
  expect_error({"--precision", "fp8"}, {"unknown precision 'fp8'", "16-mixed"});
  // A static scale ignores the dynamic options; bounds.
  expect_error({"--precision", "16-mixed", "--loss-scale", "128", "--hysteresis", "3"},
               {"--hysteresis would be ignored", "--loss-scale 128 is a static scale"});
  auto fixed = parse({"--precision", "16-mixed", "--loss-scale", "128", "--min-loss-scale", "1"});
  EXPECT_FALSE(fixed.config.has_value());
  expect_error({"--precision", "16-mixed", "--loss-scale", "1e39"}, {"'1e+39' for --loss-scale", "[0, 2^63]"});
  expect_error({"--debug-overflow-step", "2"}, {"--debug-overflow-step would be ignored"});
  expect_error({"--precision", "16-mixed", "--max-steps", "5", "--debug-overflow-step", "6"},
               {"'6' for --debug-overflow-step", "max-steps 5"});
}

}  // namespace

namespace {

TEST(CliTest, LoraOptions) {
  auto lora = parse({"--lora-rank", "8", "--lora-alpha", "16", "--lora-targets", "attn,mlp"});
  ASSERT_TRUE(lora.config.has_value()) << lora.message;
  EXPECT_EQ(lora.config->model_options.at("lora-rank"), "8");
  EXPECT_EQ(lora.config->model_options.at("lora-alpha"), "16");
  EXPECT_EQ(lora.config->model_options.at("lora-targets"), "attn,mlp");
  EXPECT_NE(to_ini(*lora.config).find("\nlora-targets = attn,mlp\n"), std::string::npos);
  expect_error({"--lora-rank", "-1"}, {"'-1' for --lora-rank", ">= 0"});
  expect_error({"--activation", "relu"}, {"invalid value 'relu' for --activation", "one of gelu, gelu_new"});
  auto tanh = parse({"--activation", "gelu_new"});
  ASSERT_TRUE(tanh.config.has_value()) << tanh.message;
  EXPECT_EQ(tanh.config->model_options.at("activation"), "gelu_new");
  expect_error({"--lora-rank", "4", "--lora-alpha", "0"}, {"'0' for --lora-alpha", "> 0"});
  // The targets are the family's names, checked by the family (spec_test).
  // Without a rank they would be ignored.
  expect_error({"--lora-alpha", "16"}, {"--lora-alpha applies only with --lora-rank > 0"});
  auto plain = parse({});
  ASSERT_TRUE(plain.config.has_value());
  EXPECT_NE(to_ini(*plain.config).find("# lora-alpha = 8  (not used without lora-rank)"), std::string::npos)
      << to_ini(*plain.config);
}

}  // namespace
