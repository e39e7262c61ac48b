// foreign_config_test - --config with a DeepSpeed JSON or an Accelerate YAML
// (recipes/config/foreign_config.h): the configurations from those projects'
// documentation (tests/fixtures/configs, SOURCES.md says where each is from)
// translate to the strata-gpt keys they mean; what strata does not support
// is one error naming the key; "auto" leaves a key to strata.
#include "tests/builtin_models.h"
#include "tests/builtin_strategies.h"
#include "strata/recipes/config/cli.h"
#include "strata/recipes/config/foreign_config.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

namespace {

const strata::recipes::ModelKeys& keys() { return strata::testing::builtin_model_keys(); }
namespace fs = std::filesystem;
using strata::recipes::ForeignConfig;

const strata::StrategyRegistry& builtins() { return strata::testing::builtin_strategies(); }

ForeignConfig read_foreign_config(const std::string& path) { return strata::recipes::read_foreign_config(path, builtins()); }

const fs::path kConfigs = fs::path(STRATA_SOURCE_DIR) / "tests" / "fixtures" / "configs";

/// The translated keys as a map (the last value of a key wins, as applied).
std::map<std::string, std::string> keys_of(const ForeignConfig& c) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : c.keys) out[k] = v;
  return out;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += s + "; ";
  return out;
}

/// The error read_foreign_config throws for `text` written to `name`.
std::string error_for(const std::string& name, const std::string& text) {
  strata::testing::TempDir dir("strata-foreign");
  const std::string path = dir.file(name);
  std::ofstream(path) << text;
  try {
    read_foreign_config(path);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ForeignConfigTest, DeepSpeedZero3OffloadExampleIsFsdpWithHostOffload) {
  const auto c = read_foreign_config((kConfigs / "ds_zero3_offload_cpu.json").string());
  const auto k = keys_of(c);
  EXPECT_EQ(k.at("strategy"), "fsdp");
  EXPECT_EQ(k.at("offload"), "cpu");
  EXPECT_TRUE(c.host_offload);
  EXPECT_EQ(k.size(), 2u) << "only the stage and the offload mean something to strata";
  EXPECT_NE(joined(c.ignored).find("zero_optimization.stage3_max_live_parameters"), std::string::npos);
}

TEST(ForeignConfigTest, DeepSpeedNvmeOffloadIsDiskOffloadInItsPath) {
  const auto k = keys_of(read_foreign_config((kConfigs / "ds_zero3_offload_nvme.json").string()));
  EXPECT_EQ(k.at("strategy"), "fsdp");
  EXPECT_EQ(k.at("offload"), "disk");
  EXPECT_EQ(k.at("offload-dir"), "/local_nvme");
}

TEST(ForeignConfigTest, DeepSpeedZero2ExamplesAreSdpAndAutoLeavesKeysToStrata) {
  auto k = keys_of(read_foreign_config((kConfigs / "ds_zero2.json").string()));
  EXPECT_EQ(k.at("strategy"), "sdp");
  EXPECT_EQ(k.count("overlap-comm"), 0u) << "sdp always overlaps: only ddp takes overlap_comm";
  // Accelerate's ZeRO-2 template: fp16 on with its scaler, AdamW, every
  // batch size and the clip "auto".
  const auto c = read_foreign_config((kConfigs / "accelerate_ds_template_zero_stage2_config.json").string());
  k = keys_of(c);
  EXPECT_EQ(k.at("strategy"), "sdp");
  EXPECT_EQ(k.at("precision"), "16-mixed");
  EXPECT_EQ(k.at("initial-scale-power"), "16");
  EXPECT_EQ(k.at("loss-scale-window"), "1000");
  EXPECT_EQ(k.at("optimizer"), "adamw");
  EXPECT_EQ(k.at("accumulate-grad-batches"), "1");
  // DeepSpeed's own console interval, not the trainer's logging: noted only.
  EXPECT_EQ(k.count("log-every-n-steps"), 0u);
  EXPECT_NE(joined(c.ignored).find("steps_per_print"), std::string::npos);
  for (const char* absent : {"batch-size", "gradient-clip-val", "lr", "weight-decay", "warmup-steps"}) {
    EXPECT_EQ(k.count(absent), 0u) << absent << " was \"auto\"";
  }
  EXPECT_EQ(c.global_batch, 0);
}

TEST(ForeignConfigTest, TransformersZero3ExampleWithAutoEverywhere) {
  const auto c = read_foreign_config((kConfigs / "hf_ds_zero3_auto.json").string());
  const auto k = keys_of(c);
  EXPECT_EQ(k.at("strategy"), "fsdp");
  EXPECT_EQ(k.at("offload"), "cpu");
  EXPECT_EQ(k.count("precision"), 0u) << "fp16.enabled is \"auto\"";
  EXPECT_NE(joined(c.ignored).find("scheduler (WarmupLR"), std::string::npos) << joined(c.ignored);
}

TEST(ForeignConfigTest, AccelerateFsdpConfigOutputMapsEveryFsdpOption) {
  const auto c = read_foreign_config((kConfigs / "accelerate_fsdp.yaml").string());
  const auto k = keys_of(c);
  const std::map<std::string, std::string> want = {
      {"strategy", "fsdp"}, {"nproc", "2"}, {"nnodes", "1"}, {"node-rank", "0"}, {"precision", "bf16-mixed"},
      {"sharding-strategy", "full_shard"}, {"wrap-policy", "block"}, {"checkpoint-format", "sharded"}};
  EXPECT_EQ(k, want);
  EXPECT_FALSE(c.host_offload);
  const auto t = keys_of(read_foreign_config((kConfigs / "accelerate_fsdp_template.yaml").string()));
  EXPECT_EQ(t.at("activation-checkpointing"), "0");
  EXPECT_EQ(t.at("precision"), "bf16-mixed");  // 'bf16', quoted in the template
}

TEST(ForeignConfigTest, AccelerateTemplatesForOneAndManyProcessesAndMachines) {
  EXPECT_EQ(keys_of(read_foreign_config((kConfigs / "accelerate_single_gpu.yaml").string())).at("strategy"), "single");
  const auto multi = keys_of(read_foreign_config((kConfigs / "accelerate_multi_gpu.yaml").string()));
  EXPECT_EQ(multi.at("strategy"), "ddp");
  const auto nodes = keys_of(read_foreign_config((kConfigs / "accelerate_multi_node.yaml").string()));
  // num_processes counts every machine's: 8 over 2 machines is 4 each.
  EXPECT_EQ(nodes.at("nproc"), "4");
  EXPECT_EQ(nodes.at("nnodes"), "2");
  EXPECT_EQ(nodes.at("master-addr"), "1234");  // quoted in the file: text, not a number
  EXPECT_EQ(nodes.at("master-port"), "9999");
  const auto ds = read_foreign_config((kConfigs / "accelerate_deepspeed_zero3_offload_plugin_docs.yaml").string());
  const auto d = keys_of(ds);
  EXPECT_EQ(d.at("strategy"), "fsdp");
  EXPECT_EQ(d.at("offload"), "cpu");
  EXPECT_EQ(d.at("precision"), "16-mixed");
  EXPECT_EQ(d.at("gradient-clip-val"), "1");
}

TEST(ForeignConfigTest, WhatStrataDoesNotSupportIsOneErrorNamingTheKey) {
  // From the documentation: a 4-machine MULTI_CPU setup launched by mpirun.
  try {
    read_foreign_config((kConfigs / "accelerate_multi_node_cpu_docs.yaml").string());
    ADD_FAILURE() << "mpirun_config was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("mpirun_config"), std::string::npos) << e.what();
  }
  // Accelerate's DeepSpeed template points at a JSON beside it that is not here.
  try {
    read_foreign_config((kConfigs / "accelerate_deepspeed.yaml").string());
    ADD_FAILURE() << "a missing deepspeed_config_file was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("deepspeed_config.deepspeed_config_file '"), std::string::npos) << e.what();
  }
  const std::map<std::string, std::pair<std::string, std::string>> cases = {
      {"ZeRO++", {"ds.json", R"({"zero_optimization": {"stage": 3, "zero_quantized_weights": true}})"}},
      {"stage 4", {"ds.json", R"({"zero_optimization": {"stage": 4}})"}},
      {"param offload below 3", {"ds.json", R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})"}},
      {"optimizer only at 3", {"ds.json", R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}})"}},
      {"nvme without path", {"ds.json", R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme"}}})"}},
      {"betas", {"ds.json", R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, "x"]}}})"}},
      {"lamb", {"ds.json", R"({"optimizer": {"type": "Lamb"}})"}},
      {"linear decay", {"ds.json", R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 10}}})"}},
      {"both precisions", {"ds.json", R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})"}},
      {"unknown top", {"ds.json", R"({"pipeline": {"stages": 2}})"}},
      {"tpu", {"a.yaml", "distributed_type: XLA\n"}},
      {"size wrap", {"a.yaml", "distributed_type: FSDP\nfsdp_config:\n  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n"}},
      {"post prefetch", {"a.yaml", "distributed_type: FSDP\nfsdp_config:\n  fsdp_backward_prefetch: BACKWARD_POST\n"}},
      {"processes", {"a.yaml", "num_machines: 2\nnum_processes: 3\n"}},
      {"fp8", {"a.yaml", "mixed_precision: fp8\n"}},
      {"bad yaml", {"a.yaml", "a: [b\n"}},
      {"bad json", {"ds.json", "{\"a\": }"}},
      {"huge number", {"ds.json", "{\"gradient_clipping\": 1e999}"}},
      {"scale not a number", {"ds.json", R"({"fp16": {"enabled": true, "loss_scale": true}})"}},
      {"lr not a number", {"ds.json", R"({"optimizer": {"type": "AdamW", "params": {"lr": true}}})"}},
      {"ratio not a number", {"ds.json", R"({"optimizer": {"params": {"lr": 0.1}}, "scheduler": {"type": "WarmupCosineLR", "params": {"cos_min_ratio": "x"}}})"}},
      {"unknown accelerate key", {"a.yaml", "distributed_type: DEEPSPEED\nmixed_precision: bf16\ndeepspeed_config_file_is_below: 1\n"}},
  };
  const std::map<std::string, std::string> names = {
      {"ZeRO++", "zero_optimization.zero_quantized_weights"}, {"stage 4", "zero_optimization.stage"},
      {"param offload below 3", "zero_optimization.offload_param.device"},
      {"optimizer only at 3", "zero_optimization.offload_param.device"},
      {"nvme without path", "zero_optimization.offload_optimizer.nvme_path"}, {"betas", "optimizer.params.betas"},
      {"lamb", "optimizer.type"}, {"linear decay", "scheduler.type"}, {"both precisions", "fp16.enabled"},
      {"unknown top", "pipeline"}, {"tpu", "distributed_type"}, {"size wrap", "fsdp_config.fsdp_auto_wrap_policy"},
      {"post prefetch", "fsdp_config.fsdp_backward_prefetch"}, {"processes", "num_processes"},
      {"fp8", "mixed_precision"}, {"bad yaml", "not valid YAML"}, {"bad json", "not valid JSON"},
      {"huge number", "not valid JSON"}, {"scale not a number", "fp16.loss_scale"},
      {"lr not a number", "optimizer.params.lr"}, {"ratio not a number", "scheduler.params.cos_min_ratio"},
      {"unknown accelerate key", "deepspeed_config_file_is_below"}};
  for (const auto& [what, file] : cases) {
    const std::string error = error_for(file.first, file.second);
    EXPECT_NE(error.find(names.at(what)), std::string::npos) << what << ": " << error;
    EXPECT_NE(error.find("config file '"), std::string::npos) << what << ": " << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << what << ": one line: " << error;
  }
}

TEST(ForeignConfigTest, NewerAccelerateAndDeepSpeedPluginDefaults) {
  strata::testing::TempDir dir("strata-foreign");
  // accelerate >= 1.6 writes FSDP1's sharding strategy as fsdp_reshard_after_forward.
  std::ofstream(dir.file("fsdp.yaml")) << "distributed_type: FSDP\nfsdp_config:\n  fsdp_reshard_after_forward: SHARD_GRAD_OP\n";
  EXPECT_EQ(keys_of(read_foreign_config(dir.file("fsdp.yaml"))).at("sharding-strategy"), "shard_grad_op");
  std::ofstream(dir.file("fsdp2.yaml")) << "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_reshard_after_forward: false\n";
  EXPECT_EQ(keys_of(read_foreign_config(dir.file("fsdp2.yaml"))).at("reshard-after-forward"), "false");
  // accelerate's DeepSpeedPlugin without zero_stage: stage 2.
  std::ofstream(dir.file("ds.yaml")) << "distributed_type: DEEPSPEED\ndeepspeed_config:\n  gradient_clipping: 1.0\n";
  EXPECT_EQ(keys_of(read_foreign_config(dir.file("ds.yaml"))).at("strategy"), "sdp");
  // A mixed_precision its DeepSpeed config contradicts.
  std::ofstream(dir.file("ds.json")) << R"({"fp16": {"enabled": true}})";
  std::ofstream(dir.file("mixed.yaml")) << "distributed_type: DEEPSPEED\nmixed_precision: bf16\ndeepspeed_config:\n"
                                           "  deepspeed_config_file: " << dir.file("ds.json") << "\n";
  try {
    read_foreign_config(dir.file("mixed.yaml"));
    ADD_FAILURE() << "bf16 beside fp16 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("mixed_precision ('bf16-mixed') disagrees"), std::string::npos) << e.what();
  }
  // WarmupLR without warmup_max_lr: DeepSpeed's 0.001, held after the warm-up.
  std::ofstream(dir.file("warm.json")) << R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}}})";
  const auto w = keys_of(read_foreign_config(dir.file("warm.json")));
  EXPECT_EQ(w.at("lr"), "0.001");
  EXPECT_EQ(w.at("min-lr"), "0.001");
  EXPECT_EQ(w.at("warmup-steps"), "5");
}

TEST(ForeignConfigTest, DeepSpeedsOwnTestConfigTrainsWithItsBetas) {
  // From DeepSpeed's test suite: Adam with betas [0.8, 0.999], once refused
  // (strata's AdamW had 0.9/0.95 fixed); a bf16 block carrying fp16's
  // loss-scaling keys, and prescale_gradients, accepted without effect.
  const std::string path = (kConfigs / "ds_torch_compile_z2.json").string();
  const auto c = read_foreign_config(path);
  const auto k = keys_of(c);
  EXPECT_EQ(k.at("strategy"), "sdp");
  EXPECT_EQ(k.at("optimizer"), "adamw");
  EXPECT_EQ(k.at("adam-beta1"), "0.8");
  EXPECT_EQ(k.at("adam-beta2"), "0.999");
  EXPECT_EQ(k.at("adam-eps"), "1e-08");
  EXPECT_EQ(k.at("weight-decay"), "3e-07");
  EXPECT_EQ(k.at("precision"), "bf16-mixed");
  EXPECT_NE(joined(c.ignored).find("bf16.loss_scale_window (bf16 needs no loss scaling)"), std::string::npos);
  EXPECT_NE(joined(c.ignored).find("prescale_gradients"), std::string::npos);
  auto parsed = strata::recipes::parse_run_config({"strata-gpt", "--config", path}, keys(), builtins());
  ASSERT_TRUE(parsed.config) << parsed.message;
  EXPECT_EQ(parsed.config->adam_beta1, 0.8);
  EXPECT_EQ(parsed.config->adam_beta2, 0.999);
  const std::string ini = strata::recipes::to_ini(*parsed.config, keys(), builtins());
  EXPECT_NE(ini.find("\nadam-beta1 = 0.8\nadam-beta2 = 0.999\n"), std::string::npos) << ini;
  // SGD's momentum and Nesterov come through too; "auto" leaves them to strata.
  EXPECT_EQ(error_for("ds.json", R"({"optimizer": {"type": "SGD", "params": {"momentum": 0.9, "nesterov": true}}})"),
            "(no error)");
  strata::testing::TempDir dir("strata-foreign-sgd");
  std::ofstream(dir.file("sgd.json")) << R"({"optimizer": {"type": "SGD", "params": {"momentum": 0.9, "nesterov": true,
                                               "dampening": 0}}})";
  const auto sgd = keys_of(read_foreign_config(dir.file("sgd.json")));
  EXPECT_EQ(sgd.at("momentum"), "0.9");
  EXPECT_EQ(sgd.at("nesterov"), "true");
  std::ofstream(dir.file("auto.json")) << R"({"optimizer": {"type": "AdamW", "params": {"betas": "auto", "eps": "auto"}}})";
  EXPECT_EQ(keys_of(read_foreign_config(dir.file("auto.json"))).count("adam-beta1"), 0u);
  EXPECT_NE(error_for("d.json", R"({"optimizer": {"type": "SGD", "params": {"dampening": 0.1}}})").find("dampening"),
            std::string::npos);
  EXPECT_NE(error_for("b.json", R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})")
                .find("optimizer.params.betas"),
            std::string::npos);
}

TEST(ForeignConfigTest, ParsedThroughTheCliTheCommandLineStillWins) {
  const std::string path = (kConfigs / "accelerate_fsdp.yaml").string();
  auto parsed = strata::recipes::parse_run_config({"strata-gpt", "--config", path}, keys(), builtins());
  ASSERT_TRUE(parsed.config) << parsed.message;
  EXPECT_EQ(parsed.config->strategy, "fsdp");
  EXPECT_EQ(parsed.config->nproc, 2);
  EXPECT_EQ(parsed.config->precision, "bf16-mixed");
  EXPECT_EQ(parsed.config->checkpoint_format, "sharded");
  parsed = strata::recipes::parse_run_config({"strata-gpt", "--config", path, "--nproc", "3", "--precision", "32"},
                                             keys(), builtins());
  ASSERT_TRUE(parsed.config) << parsed.message;
  EXPECT_EQ(parsed.config->nproc, 3);
  EXPECT_EQ(parsed.config->precision, "32");
  // An unsupported key through the CLI: exit 2 and the key named.
  strata::testing::TempDir dir("strata-foreign-cli");
  std::ofstream(dir.file("ds.json")) << R"({"zero_optimization": {"stage": 3, "mics_shard_size": 8}})";
  parsed = strata::recipes::parse_run_config({"strata-gpt", "--config", dir.file("ds.json")}, keys(), builtins());
  EXPECT_FALSE(parsed.config);
  EXPECT_EQ(parsed.exit_code, 2);
  EXPECT_NE(parsed.message.find("zero_optimization.mics_shard_size"), std::string::npos) << parsed.message;
}

}  // namespace
