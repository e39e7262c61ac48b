#include "strata/recipes/app/small_cli.h"

#include <c10/util/Exception.h>

#include <iostream>
#include <sstream>

namespace strata::recipes {

int run_small_cli(int argc, char** argv, const boost::program_options::options_description& desc,
                  const char* positional, const std::function<int()>& run) {
  namespace po = boost::program_options;
  po::positional_options_description positionals;
  positionals.add(positional, 1);
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(argc, argv).options(desc).positional(positionals).run(), vm);
    if (vm.count("help")) {
      std::cout << desc << std::endl;
      return 0;
    }
    po::notify(vm);
    return run();
  } catch (const po::error& e) {
    std::cerr << "error: " << e.what() << "; see --help" << std::endl;
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
  }
  return 2;
}

std::vector<int32_t> parse_token_ids(std::string_view text, const std::string& what) {
  std::vector<int32_t> ids;
  std::istringstream in{std::string(text)};
  for (std::string word; in >> word;) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TORCH_CHECK_VALUE(used == word.size() && id >= 0 && id <= INT32_MAX, what, "'", word, "' is not a token id");
    ids.push_back(int32_t(id));
  }
  return ids;
}

}  // namespace strata::recipes
