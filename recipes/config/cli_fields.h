#pragma once
// The recipe binaries' options as data (internal to recipes/config/cli.cpp): each
// option's key, --help group, RunConfig member and help text. One table
// serves the command line, the INI config file, --help and to_ini(); the
// registered strategies' options (strategies/spec.h) join it after
// kStrategyOptionsAfter, the model families' (recipes/models/spec.h) after
// kModelOptionsAfter.
#include "strata/recipes/config/cli.h"

#include <string>
#include <variant>
#include <vector>

namespace strata::recipes {

using Member = std::variant<std::string RunConfig::*, int64_t RunConfig::*, int RunConfig::*,
                            uint64_t RunConfig::*, double RunConfig::*, bool RunConfig::*>;

/// One option: the same key on the command line (--key) and in the INI file.
struct Field {
  const char* key;
  int group;  ///< index into group_titles()
  Member member;
  const char* help;
  bool flag = false;  ///< bool that may be given bare (--key means true)
};

std::vector<std::string> group_titles();

/// The group --help leaves out (--help-all shows it): switches strata's own
/// tests use, shipped in the binary but not meant for training runs.
constexpr int kTestingGroup = 6;
constexpr int kInteropGroup = 5;

/// Printed by --help-all after the testing options.
extern const char* const kTestingEnvironment;

/// Every RunConfig field, in to_ini() and --help order (strategy options not included).
std::vector<Field> fields();

/// The model families' options are listed right after this key.
constexpr const char* kModelOptionsAfter = "preset";
/// The strategy options are listed right after this key.
constexpr const char* kStrategyOptionsAfter = "comm-timeout";

}  // namespace strata::recipes
