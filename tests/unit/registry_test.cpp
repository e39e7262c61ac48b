// registry_test - Unit tests for strategies/registry.cpp
#include "strategies/registry.h"

#include <gtest/gtest.h>

namespace {

TEST(StrategyRegistryTest, AliasesResolveToCanonicalNames) {
  strata::StrategyRegistry registry;
  strata::register_builtin_strategies(registry);
  EXPECT_EQ(registry.resolve("zero1"), "oss");
  EXPECT_EQ(registry.resolve("zero2"), "sdp");
  for (const auto& name : {"single", "ddp", "oss", "sdp", "zero1", "zero2"}) {
    auto s = registry.create(name, strata::Comm());
    EXPECT_EQ(s->name(), registry.resolve(name));
  }
}

TEST(StrategyRegistryTest, UnknownNameListsAvailable) {
  strata::StrategyRegistry registry;
  strata::register_builtin_strategies(registry);
  try {
    registry.create("zero9", strata::Comm());
    FAIL() << "zero9 accepted";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("'zero9'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("oss (zero1)"), std::string::npos) << msg;
  }
}

TEST(StrategyRegistryTest, DuplicateNamesFail) {
  strata::StrategyRegistry registry;
  strata::register_builtin_strategies(registry);
  EXPECT_THROW(registry.add("ddp", nullptr, ""), c10::Error);
  EXPECT_THROW(registry.add_alias("zero1", "ddp"), c10::Error);
  EXPECT_THROW(registry.add_alias("x", "missing"), c10::Error);
}

}  // namespace
