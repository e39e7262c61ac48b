#pragma once
// Which of a model's units (its blocks) each pipeline stage runs: contiguous
// ranges, balanced so the slowest stage is as fast as it can be, the first
// stage's embedding and the last stage's head counted with them; or given by
// hand (--pp-split "3,3,2": the units per stage).
//
// Example: 8 blocks of cost 1, an embedding of 0.5 and a head of 1.5, 4 stages:
//   balanced_split({1,1,1,1,1,1,1,1}, 4, 0.5, 1.5)  // [0,2) [2,4) [4,7) [7,8): 2.5 2 3 2.5
//   (an even [0,2) [2,4) [4,6) [6,8) would cost 2.5 2 2 3.5)
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace strata::pp {

/// A stage's units: [first, second).
using UnitRange = std::pair<int64_t, int64_t>;

/// `stages` contiguous ranges over `unit_costs` (every stage at least one
/// unit) whose largest cost, the first stage's with `first_extra` and the
/// last's with `last_extra`, is the smallest possible; ties go to the
/// earliest split. c10::ValueError when there are fewer units than stages.
std::vector<UnitRange> balanced_split(const std::vector<double>& unit_costs, int stages, double first_extra = 0,
                                      double last_extra = 0);

/// `text` ("3,3,2": units per stage) as ranges over `units`; c10::ValueError
/// naming the value unless it gives `stages` counts >= 1 summing to `units`.
std::vector<UnitRange> parse_split(const std::string& text, int64_t units, int stages);

}  // namespace strata::pp
