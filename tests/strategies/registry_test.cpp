// registry_test - strategies/registry.cpp and strategies/spec.cpp: specs
// register by name and alias, their options parse typed with their rules, a
// user's spec registers exactly as the built-ins do, and the built-ins' memory
// and communication models say what the ZeRO paper says.
#include "strata/strategies/registry.h"

#include "strata/strategies/grad_sync.h"
#include "strata/strategies/single/single_device.h"

#include <gtest/gtest.h>

namespace {

strata::StrategyRegistry builtins() {
  strata::StrategyRegistry registry;
  strata::register_builtin_strategies(registry);
  return registry;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

/// A user's strategy: one process's behaviour, two options of its own, one shared.
strata::StrategySpec user_spec(int* built_with = nullptr) {
  using strata::StrategyOption;
  return strata::StrategySpec("mine", "a user's strategy")
      .aliases({"my-alias"})
      .options({StrategyOption::integer("sync-every", 8, "steps between averages").at_least(1),
                StrategyOption::real("outer-lr", 0.7, "outer step size").above(0),
                StrategyOption::choice("outer-optimizer", "nesterov", {"nesterov", "average"}, "outer step"),
                strata::find_unused_parameters_option()})
      .validate([](const strata::StrategyArgs& a) {
        return a.text("outer-optimizer") == "average" && a.given("outer-lr")
                   ? std::string("--outer-lr applies to --outer-optimizer nesterov only")
                   : std::string();
      })
      .factory([built_with](strata::Comm comm, const strata::StrategyArgs& a, const strata::StrategyContext&) {
        if (built_with != nullptr) *built_with = static_cast<int>(a.integer("sync-every"));
        return std::make_unique<strata::SingleDeviceStrategy>(std::move(comm));
      });
}

TEST(StrategyRegistryTest, AliasesResolveToCanonicalNames) {
  const auto registry = builtins();
  EXPECT_EQ(registry.resolve("zero1"), "oss");
  EXPECT_EQ(registry.resolve("zero2"), "sdp");
  EXPECT_EQ(registry.resolve("zero3"), "fsdp");
  for (const auto& name : {"single", "ddp", "oss", "sdp", "zero1", "zero2"}) {
    auto s = registry.create(name, strata::Comm());
    EXPECT_EQ(s->name(), registry.resolve(name));
  }
  EXPECT_EQ(registry.reference()->name(), "ddp");
  EXPECT_EQ(registry.single_process()->name(), "single");
}

TEST(StrategyRegistryTest, UnknownNameListsAvailable) {
  const auto registry = builtins();
  const std::string msg = error_of([&] { registry.create("zero9", strata::Comm()); });
  EXPECT_NE(msg.find("'zero9'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("oss (zero1)"), std::string::npos) << msg;
}

TEST(StrategyRegistryTest, ConflictingRegistrationsFail) {
  auto registry = builtins();
  EXPECT_THROW(registry.add(strata::StrategySpec("ddp", "again").factory(user_spec().factory())), c10::Error);
  EXPECT_THROW(registry.add(user_spec().aliases({"zero1"})), c10::Error);  // an alias taken
  EXPECT_THROW(registry.add(strata::StrategySpec("nofactory", "x")), c10::Error);
  EXPECT_THROW(registry.add(user_spec().reference(true)), c10::Error);  // ddp already is
  // One key, one meaning: bucket-cap-mb is a number defaulting to 25.
  const std::string msg = error_of([&] {
    registry.add(user_spec().options({strata::StrategyOption::integer("bucket-cap-mb", 4, "other")}));
  });
  EXPECT_NE(msg.find("bucket-cap-mb"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ddp, oss (zero1) and sdp (zero2)"), std::string::npos) << msg;
  EXPECT_FALSE(registry.contains("mine"));  // nothing half-registered
  EXPECT_THROW(registry.add(user_spec().aliases({"again", "again"})), c10::Error);
  EXPECT_THROW(registry.add(user_spec().aliases({"mine"})), c10::Error);
  EXPECT_THROW(registry.add(user_spec().options({strata::StrategyOption::integer("k", 1, "a"),
                                                 strata::StrategyOption::integer("k", 1, "b")})),
               c10::Error);
  // find-unused-parameters is a bare flag everywhere (--find-unused-parameters alone means true).
  EXPECT_THROW(registry.add(user_spec().options({strata::StrategyOption::boolean("find-unused-parameters", false, "x")})),
               c10::Error);
  EXPECT_FALSE(registry.contains("mine"));
}

TEST(StrategyRegistryTest, AContextWithoutTheNodeSizeRefusesHybridSharding) {
  // hybrid_shard needs LOCAL_WORLD_SIZE; a context that does not know it
  // (the default) must not run it as something else.
  const auto registry = builtins();
  const auto& fsdp = registry.spec("fsdp");
  const auto args = fsdp.parse_args({{"sharding-strategy", "hybrid_shard"}});
  strata::StrategyContext unknown;
  unknown.world_size = 4;
  EXPECT_NE(fsdp.check_run(args, unknown).find("needs the node size"), std::string::npos) << fsdp.check_run(args, unknown);
  strata::StrategyContext known = unknown;
  known.local_world_size = 2;
  EXPECT_EQ(fsdp.check_run(args, known), "");
  known.local_world_size = 3;
  EXPECT_NE(fsdp.check_run(args, known).find("3"), std::string::npos);
}

TEST(StrategyRegistryTest, OptionsParseTypedWithTheirRules) {
  const auto spec = user_spec();
  const auto defaults = spec.parse_args();
  EXPECT_EQ(defaults.integer("sync-every"), 8);
  EXPECT_DOUBLE_EQ(defaults.real("outer-lr"), 0.7);
  EXPECT_FALSE(defaults.given("sync-every"));
  const auto given = spec.parse_args({{"sync-every", "3"}, {"find-unused-parameters", "yes"}});
  EXPECT_EQ(given.integer("sync-every"), 3);
  EXPECT_TRUE(given.boolean("find-unused-parameters"));
  EXPECT_TRUE(given.given("sync-every"));
  EXPECT_THROW(given.text("sync-every"), c10::Error);  // another kind
  EXPECT_THROW(given.integer("nope"), c10::Error);     // not declared
  const auto bad = [&](std::map<std::string, std::string> options) {
    return error_of([&] { spec.parse_args(options); });
  };
  EXPECT_NE(bad({{"sync-every", "x"}}).find("invalid value 'x' for --sync-every: expected an integer"),
            std::string::npos);
  EXPECT_NE(bad({{"sync-every", "0"}}).find("must be >= 1 for strategy 'mine'"), std::string::npos);
  EXPECT_NE(bad({{"outer-lr", "0"}}).find("must be > 0"), std::string::npos);
  EXPECT_NE(bad({{"outer-optimizer", "adam"}}).find("allowed: nesterov, average"), std::string::npos);
  EXPECT_NE(bad({{"sharding-strategy", "full_shard"}}).find("strategy 'mine' has no option 'sharding-strategy'"),
            std::string::npos);
  EXPECT_NE(bad({{"outer-optimizer", "average"}, {"outer-lr", "1"}}).find("nesterov only"), std::string::npos);
  EXPECT_TRUE(bad({{"outer-optimizer", "average"}}).empty());
}

TEST(StrategyRegistryTest, AUsersSpecRegistersAsTheBuiltinsDo) {
  auto registry = builtins();
  int built_with = 0;
  registry.add(user_spec(&built_with));
  EXPECT_EQ(registry.resolve("my-alias"), "mine");
  EXPECT_NE(registry.available().find("mine (my-alias)"), std::string::npos) << registry.available();
  EXPECT_EQ(registry.declared_by("sync-every"), "mine (my-alias) only");
  EXPECT_EQ(registry.declared_by("find-unused-parameters"),
            "ddp, oss (zero1), sdp (zero2), fsdp (zero3) and mine (my-alias)");
  bool listed = false;
  for (const auto* option : registry.all_options()) listed = listed || option->key() == "outer-lr";
  EXPECT_TRUE(listed);
  registry.create("my-alias", strata::Comm(), {{"sync-every", "5"}});
  EXPECT_EQ(built_with, 5);
}

strata::MemoryQuery query(int world, int64_t params = 1000) {
  strata::MemoryQuery q;
  q.model = {.params = params, .trainable = params, .units = 4, .unit_params = params / 5, .unit_trainable = params / 5};
  q.world_size = q.local_world_size = world;
  return q;
}

TEST(StrategyRegistryTest, BuiltinMemoryModelsAreTheZeroFormulas) {
  const auto registry = builtins();
  const int64_t p = 1000;
  auto state = [&](const std::string& name, int world) {
    auto q = query(world, p);
    q.args = registry.spec(name).parse_args();
    return registry.spec(name).memory()(q)->model_state();
  };
  EXPECT_EQ(state("single", 1), 16 * p);
  EXPECT_EQ(state("ddp", 4), 16 * p);
  EXPECT_EQ(state("oss", 4), 8 * p + 8 * p / 4);
  EXPECT_EQ(state("sdp", 4), 4 * p + 12 * p / 4);
  EXPECT_EQ(state("fsdp", 4), 16 * p / 4);
}

TEST(StrategyRegistryTest, BuiltinCommunicationModelsAreTheZeroMultiples) {
  // Bytes per step ÷ Ψ·(N-1)/N (Ψ = 4 bytes x parameters): ddp, oss and sdp
  // send 2Ψ; fsdp 3Ψ less the last unit's backward gather (kept from forward).
  const auto registry = builtins();
  const int world = 4;
  const double psi = 4.0 * 1000 * (world - 1) / world;
  auto multiple = [&](const std::string& name, std::map<std::string, std::string> options = {}) {
    auto q = query(world);
    q.args = registry.spec(name).parse_args(options);
    return registry.spec(name).communication()(q)->total() / psi;
  };
  EXPECT_DOUBLE_EQ(multiple("single"), 0.0);
  EXPECT_DOUBLE_EQ(multiple("ddp"), 2.0);
  EXPECT_DOUBLE_EQ(multiple("oss"), 2.0);
  EXPECT_DOUBLE_EQ(multiple("sdp"), 2.0);
  EXPECT_DOUBLE_EQ(multiple("fsdp"), 2.0 + 3 * 0.2);                                  // units 0..2 again
  EXPECT_DOUBLE_EQ(multiple("fsdp", {{"reshard-after-forward", "true"}}), 2.0 + 4 * 0.2);  // all 4 again
  EXPECT_DOUBLE_EQ(multiple("fsdp", {{"sharding-strategy", "shard_grad_op"}}), 2.0);
  EXPECT_DOUBLE_EQ(multiple("fsdp", {{"reduce-dtype", "bf16"}}), 1.5 + 3 * 0.2);
  // Gradient accumulation: fsdp gathers every micro-batch, reduces once;
  // ddp reduces once (no_sync on the others).
  auto q = query(world);
  q.micro_batches = 3;
  q.args = registry.spec("fsdp").parse_args();
  EXPECT_DOUBLE_EQ(registry.spec("fsdp").communication()(q)->total() / psi, 3 * 1.6 + 1.0);
  q.args = registry.spec("ddp").parse_args();
  EXPECT_DOUBLE_EQ(registry.spec("ddp").communication()(q)->total() / psi, 2.0);
}

}  // namespace
