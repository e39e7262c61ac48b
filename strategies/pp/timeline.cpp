// simulate() and render() of schedule.h: a schedule's action lists run
// against per-stage costs, checked on the way.
#include "strata/strategies/pp/schedule.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>

namespace strata::pp {

namespace {

using Key = std::tuple<Op, int, int>;  // op, stage, micro-batch

bool is_backward(Op op) { return op == Op::Backward || op == Op::BackwardInput; }

/// What each compute action waits for: the end times of those, or nullopt
/// while one of them has not run.
class Ends {
 public:
  explicit Ends(int stages) : stages_(stages) {}
  void set(const Action& a, double end) { ends_[{a.op, a.stage, a.microbatch}] = end; }
  std::optional<double> ready(const Action& a) const {
    double at = 0;
    auto need = [&](Op op, int stage) {
      const auto it = ends_.find({op, stage, a.microbatch});
      if (it == ends_.end()) return false;
      at = std::max(at, it->second);
      return true;
    };
    // The input gradient from the next stage: from its B or its I.
    auto need_grad = [&](int stage) { return need(Op::Backward, stage) || need(Op::BackwardInput, stage); };
    switch (a.op) {
      case Op::Forward:
        if (a.stage > 0 && !need(Op::Forward, a.stage - 1)) return std::nullopt;
        return at;
      case Op::Backward:
      case Op::BackwardInput:
        if (!need(Op::Forward, a.stage)) return std::nullopt;
        if (a.stage + 1 < stages_ && !need_grad(a.stage + 1)) return std::nullopt;
        return at;
      case Op::BackwardWeight:
        if (!need(Op::BackwardInput, a.stage)) return std::nullopt;
        return at;
      default:
        return at;  // transfers: free here
    }
  }

 private:
  int stages_;
  std::map<Key, double> ends_;
};

double cost_of(const Action& a, const StageCosts& c, int virtual_stages) {
  const double per = 1.0 / virtual_stages;
  switch (a.op) {
    case Op::Forward: return c.forward * per;
    case Op::Backward: return (c.backward_input + c.backward_weight) * per;
    case Op::BackwardInput: return c.backward_input * per;
    case Op::BackwardWeight: return c.backward_weight * per;
    default: return 0.0;
  }
}

/// Every (stage, micro-batch) forwarded once and backwarded once (B, or I
/// and W), each on the rank holding the stage.
void check_complete(const Schedule& s) {
  const int m = s.options().microbatches();
  std::map<Key, int> seen;
  for (size_t r = 0; r < s.actions().size(); ++r) {
    for (const Action& a : s.actions()[r]) {
      TORCH_CHECK_VALUE(a.stage >= 0 && a.stage < s.stages() && a.microbatch >= 0 && a.microbatch < m,
                        s.name(), ": rank ", r, " runs ", to_string(a), ", outside ", s.stages(), " stages and ", m,
                        " micro-batches");
      TORCH_CHECK_VALUE(s.rank_of(a.stage) == int(r), s.name(), ": rank ", r, " runs ", to_string(a), " of rank ",
                        s.rank_of(a.stage), "'s stage");
      const int times = ++seen[Key(a.op, a.stage, a.microbatch)];
      TORCH_CHECK_VALUE(times == 1, s.name(), ": rank ", r, " runs ", to_string(a), " twice");
    }
  }
  for (int stage = 0; stage < s.stages(); ++stage) {
    for (int i = 0; i < m; ++i) {
      const Action f = {Op::Forward, stage, i, -1};
      const bool forward = seen.count(Key(Op::Forward, stage, i)) > 0;
      TORCH_CHECK_VALUE(forward, s.name(), ": ", to_string(f), " never runs");
      const bool whole = seen.count(Key(Op::Backward, stage, i)) > 0;
      const bool split = seen.count(Key(Op::BackwardInput, stage, i)) + seen.count(Key(Op::BackwardWeight, stage, i)) == 2;
      TORCH_CHECK_VALUE(whole != split, s.name(), ": micro-batch ", i, " of stage ", stage,
                        " needs its backward once, as B or as I and W");
    }
  }
}

}  // namespace

Timeline simulate(const Schedule& s, const StageCosts& costs) {
  check_complete(s);
  const size_t ranks = s.actions().size();
  Timeline t;
  t.ranks.resize(ranks);
  std::vector<size_t> next(ranks, 0);
  std::vector<double> free_at(ranks, 0.0);
  Ends ends(s.stages());
  size_t left = 0;
  for (const auto& list : s.actions()) left += list.size();
  while (left > 0) {
    // Among the ranks whose next action can run, the one that starts it
    // earliest goes first: the order a real run would see them.
    std::optional<std::pair<double, size_t>> first;
    for (size_t r = 0; r < ranks; ++r) {
      if (next[r] == s.actions()[r].size()) continue;
      const auto ready = ends.ready(s.actions()[r][next[r]]);
      if (!ready) continue;
      const double start = std::max(*ready, free_at[r]);
      if (!first || start < first->first) first = {start, r};
    }
    if (!first) {
      std::vector<std::string> waiting;
      for (size_t r = 0; r < ranks; ++r)
        if (next[r] < s.actions()[r].size()) waiting.push_back(c10::str("rank ", r, " at ", to_string(s.actions()[r][next[r]])));
      TORCH_CHECK_VALUE(false, s.name(), " deadlocks: ", c10::Join(", ", waiting), " wait for what never runs first");
    }
    const auto [start, r] = *first;
    const Action& a = s.actions()[r][next[r]++];
    const double end = start + cost_of(a, costs, s.options().virtual_stages());
    ends.set(a, end);
    free_at[r] = end;
    t.ranks[r].push_back({a, start, end});
    t.makespan = std::max(t.makespan, end);
    --left;
  }
  for (const auto& intervals : t.ranks) {
    double busy = 0;
    for (const auto& i : intervals) busy += i.end - i.start;
    t.idle_share.push_back(t.makespan > 0 ? 1.0 - busy / t.makespan : 0.0);
  }
  return t;
}

std::vector<int> in_flight(const Schedule& s) {
  std::vector<int> peak;
  for (const auto& list : s.actions()) {
    int held = 0, most = 0;
    for (const Action& a : list) {
      if (a.op == Op::Forward) most = std::max(most, ++held);
      if (is_backward(a.op)) --held;
    }
    peak.push_back(most);
  }
  return peak;
}

std::string render(const Timeline& t, double unit) {
  TORCH_CHECK_VALUE(unit > 0, "render: unit ", unit, " must be > 0");
  const auto cells = size_t(std::llround(t.makespan / unit));
  std::vector<std::vector<std::string>> rows(t.ranks.size(), std::vector<std::string>(cells, "."));
  size_t width = 1;
  for (size_t r = 0; r < t.ranks.size(); ++r) {
    for (const auto& i : t.ranks[r]) {
      const auto from = size_t(std::llround(i.start / unit)), to = size_t(std::llround(i.end / unit));
      const std::string label = op_name(i.action.op) + std::to_string(i.action.microbatch);
      width = std::max(width, label.size());
      for (size_t c = from; c < to && c < cells; ++c) rows[r][c] = label;
    }
  }
  std::ostringstream out;
  for (size_t r = 0; r < rows.size(); ++r) {
    out << "rank " << r << " |";
    for (const auto& cell : rows[r]) out << ' ' << cell << std::string(width - cell.size(), ' ');
    out << '\n';
  }
  return out.str();
}

}  // namespace strata::pp
