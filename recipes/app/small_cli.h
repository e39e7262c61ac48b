#pragma once
// What strata's small tools (strata-tokenize, strata-generate) share: their
// main around Boost.Program_options, and token ids read from text.
#include <boost/program_options.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::recipes {

/// Parses argv against `desc` (one positional argument, `positional`);
/// --help prints `desc` (exit 0); then `run`. Bad input (a program-options
/// error, a c10::Error) is one line on stderr, exit 2.
int run_small_cli(int argc, char** argv, const boost::program_options::options_description& desc,
                  const char* positional, const std::function<int()>& run);

/// "12 7 3" -> ids; c10::ValueError naming `what` and the word that is no id.
std::vector<int32_t> parse_token_ids(std::string_view text, const std::string& what);

}  // namespace strata::recipes
