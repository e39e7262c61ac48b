#include "strata/strategies/pp/split.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <sstream>

namespace strata::pp {

std::vector<UnitRange> balanced_split(const std::vector<double>& costs, int stages, double first_extra,
                                      double last_extra) {
  const auto n = int64_t(costs.size());
  TORCH_CHECK_VALUE(stages >= 1 && n >= stages, "a pipeline of ", stages, " stages needs at least as many units; the model has ", n);
  std::vector<double> prefix(size_t(n) + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + costs[size_t(i)];
  auto cost = [&](int stage, int64_t from, int64_t to) {
    return prefix[size_t(to)] - prefix[size_t(from)] + (stage == 0 ? first_extra : 0) + (stage == stages - 1 ? last_extra : 0);
  };
  // best[s][i]: the smallest largest cost of stages 0..s-1 over units [0, i);
  // dynamic programming over where each stage ends (n and stages are small).
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(size_t(stages) + 1, std::vector<double>(size_t(n) + 1, inf));
  std::vector<std::vector<int64_t>> cut(size_t(stages) + 1, std::vector<int64_t>(size_t(n) + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int64_t i = s; i <= n - (stages - s); ++i) {
      for (int64_t j = s - 1; j < i; ++j) {
        const double v = std::max(best[size_t(s) - 1][size_t(j)], cost(s - 1, j, i));
        if (v < best[size_t(s)][size_t(i)] - 1e-12) {
          best[size_t(s)][size_t(i)] = v;
          cut[size_t(s)][size_t(i)] = j;
        }
      }
    }
  }
  std::vector<UnitRange> out(static_cast<size_t>(stages));
  int64_t end = n;
  for (int s = stages; s >= 1; --s) {
    const int64_t begin = cut[size_t(s)][size_t(end)];
    out[size_t(s) - 1] = {begin, end};
    end = begin;
  }
  return out;
}

std::vector<UnitRange> parse_split(const std::string& text, int64_t units, int stages) {
  std::vector<UnitRange> out;
  std::istringstream in(text);
  int64_t at = 0;
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const long long count = std::strtoll(item.c_str(), &end, 10);
    TORCH_CHECK_VALUE(!item.empty() && *end == '\0' && count >= 1, "--pp-split '", text, "': '", item,
                      "' is not a count of units >= 1");
    out.push_back({at, at + count});
    at += count;
  }
  TORCH_CHECK_VALUE(int(out.size()) == stages && at == units, "--pp-split '", text, "' gives ", out.size(),
                    " stages over ", at, " units; the pipeline has ", stages, " stages and the model ", units,
                    " units");
  return out;
}

}  // namespace strata::pp
