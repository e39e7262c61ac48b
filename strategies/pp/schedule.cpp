// Pipeline schedules as action lists, and their simulation (schedule.h).
#include "strata/strategies/pp/schedule.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <cctype>

namespace strata::pp {

namespace {

using Lists = std::vector<std::vector<Action>>;

Action act(Op op, int stage, int microbatch) { return Action{op, stage, microbatch, -1}; }

/// GPipe: every forward, then every backward (one stage per rank).
Lists gpipe(int p, int m) {
  Lists out(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    for (int i = 0; i < m; ++i) out[r].push_back(act(Op::Forward, r, i));
    for (int i = 0; i < m; ++i) out[r].push_back(act(Op::Backward, r, i));
  }
  return out;
}

/// 1F1B (PipeDream-flush): p − r − 1 warm-up forwards, then one forward and
/// one backward in turn, then the remaining backwards. With `split` (ZB-H1)
/// the backward is I, and rank r runs each micro-batch's W r steps late: in
/// 1F1B rank r idles r backwards at the end (the last input gradient reaches
/// it r stages after the last rank's), and those late weight gradients fill
/// that time. Activations held stay 1F1B's: p − r until I, r more until W.
Lists one_f_one_b(int p, int m, bool split) {
  Lists out(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    auto& a = out[r];
    const int warmup = std::min(p - r - 1, m);
    int next_w = 0;
    auto backward = [&](int i) { a.push_back(act(split ? Op::BackwardInput : Op::Backward, r, i)); };
    for (int i = 0; i < warmup; ++i) a.push_back(act(Op::Forward, r, i));
    for (int i = 0; i + warmup < m; ++i) {
      a.push_back(act(Op::Forward, r, i + warmup));
      backward(i);
      if (split && next_w <= i - r) a.push_back(act(Op::BackwardWeight, r, next_w++));
    }
    for (int i = m - warmup; i < m; ++i) {
      backward(i);
      if (split && next_w <= i - r) a.push_back(act(Op::BackwardWeight, r, next_w++));
    }
    while (split && next_w < m) a.push_back(act(Op::BackwardWeight, r, next_w++));
  }
  return out;
}

/// Megatron's interleaved 1F1B: V stages per rank (r, r + p, ...); forwards
/// run p micro-batches through one virtual stage, then the next, and the
/// backwards the same in reverse; warm-up (p − r − 1)·2 + (V − 1)·p.
Lists interleaved(int p, int m, int v) {
  Lists out(static_cast<size_t>(p));
  const int total = m * v;
  auto chunk = [&](int k, bool forward) {
    const int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  auto microbatch = [&](int k) { return (k / (p * v)) * p + k % p; };
  for (int r = 0; r < p; ++r) {
    auto& a = out[r];
    const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
    auto forward = [&](int k) { a.push_back(act(Op::Forward, chunk(k, true) * p + r, microbatch(k))); };
    auto backward = [&](int k) { a.push_back(act(Op::Backward, chunk(k, false) * p + r, microbatch(k))); };
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int k = 0; k + warmup < total; ++k) {
      forward(k + warmup);
      backward(k);
    }
    for (int k = total - warmup; k < total; ++k) backward(k);
  }
  return out;
}

std::string canonical(const std::string& name) {
  std::string lower;
  for (char c : name) lower += char(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "interleaved1f1b") return "interleaved-1f1b";
  if (lower == "zbh1" || lower == "zb-h1") return "zero-bubble";
  return lower;
}

}  // namespace

std::string op_name(Op op) {
  switch (op) {
    case Op::Forward: return "F";
    case Op::Backward: return "B";
    case Op::BackwardInput: return "I";
    case Op::BackwardWeight: return "W";
    case Op::SendActivation: return "SF";
    case Op::RecvActivation: return "RF";
    case Op::SendGrad: return "SB";
    case Op::RecvGrad: return "RB";
  }
  return "?";
}

std::string to_string(const Action& a) {
  std::string s = op_name(a.op) + std::to_string(a.microbatch) + "@" + std::to_string(a.stage);
  if (a.op == Op::SendActivation || a.op == Op::SendGrad) s += "->" + std::to_string(a.peer);
  if (a.op == Op::RecvActivation || a.op == Op::RecvGrad) s += "<-" + std::to_string(a.peer);
  return s;
}

Schedule::Schedule(std::string name, const ScheduleOptions& options, std::vector<std::vector<Action>> actions)
    : name_(std::move(name)), options_(options), actions_(std::move(actions)) {}

std::vector<std::string> schedule_names() { return {"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"}; }

std::unique_ptr<Schedule> make_schedule(const std::string& given, const ScheduleOptions& o) {
  const std::string name = canonical(given);
  const int p = o.ranks(), m = o.microbatches(), v = o.virtual_stages();
  TORCH_CHECK_VALUE(p >= 1, "pipeline ranks ", p, " must be >= 1");
  TORCH_CHECK_VALUE(m >= 1, "micro-batches ", m, " must be >= 1");
  TORCH_CHECK_VALUE(v >= 1, "virtual stages per rank ", v, " must be >= 1");
  TORCH_CHECK_VALUE(name == "interleaved-1f1b" || v == 1, "--pp-schedule ", given, " runs one stage per rank, not ",
                    v, "; virtual stages need interleaved-1f1b");
  Lists lists;
  if (name == "gpipe") {
    lists = gpipe(p, m);
  } else if (name == "1f1b" || name == "zero-bubble") {
    lists = one_f_one_b(p, m, name == "zero-bubble");
  } else if (name == "interleaved-1f1b") {
    // Megatron's order runs micro-batches p at a time through each virtual stage.
    TORCH_CHECK_VALUE(m % p == 0, "interleaved-1f1b needs the micro-batches (", m,
                      ") to be a multiple of the pipeline ranks (", p, ")");
    lists = interleaved(p, m, v);
  } else {
    TORCH_CHECK_VALUE(false, "unknown pipeline schedule '", given, "'; allowed: ", c10::Join(", ", schedule_names()),
                      " (or GPipe, 1F1B, Interleaved1F1B, ZBH1)");
  }
  return std::make_unique<Schedule>(name, o, std::move(lists));
}

std::vector<std::vector<Action>> with_communication(const Schedule& s) {
  std::vector<std::vector<Action>> out(s.actions().size());
  for (size_t r = 0; r < s.actions().size(); ++r) {
    for (const Action& a : s.actions()[r]) {
      const int prev = a.stage > 0 ? s.rank_of(a.stage - 1) : -1;
      const int next = a.stage + 1 < s.stages() ? s.rank_of(a.stage + 1) : -1;
      const bool forward = a.op == Op::Forward;
      const bool to_input = a.op == Op::Backward || a.op == Op::BackwardInput;
      // A neighbouring stage on this same rank hands over in memory.
      if (forward && prev >= 0 && prev != int(r)) out[r].push_back({Op::RecvActivation, a.stage, a.microbatch, prev});
      if (to_input && next >= 0 && next != int(r)) out[r].push_back({Op::RecvGrad, a.stage, a.microbatch, next});
      out[r].push_back(a);
      if (forward && next >= 0 && next != int(r)) out[r].push_back({Op::SendActivation, a.stage, a.microbatch, next});
      if (to_input && prev >= 0 && prev != int(r)) out[r].push_back({Op::SendGrad, a.stage, a.microbatch, prev});
    }
  }
  return out;
}

namespace {
bool is_transfer(Op op) {
  return op == Op::SendActivation || op == Op::RecvActivation || op == Op::SendGrad || op == Op::RecvGrad;
}
}  // namespace

int message_of(const Action& a, int microbatches) {
  TORCH_CHECK(is_transfer(a.op), "message_of: ", to_string(a), " is no send or receive");
  const bool activation = a.op == Op::SendActivation || a.op == Op::RecvActivation;
  // The boundary between stage b and b + 1, named by b.
  const int boundary = a.op == Op::SendActivation ? a.stage
                       : a.op == Op::RecvActivation ? a.stage - 1
                       : a.op == Op::SendGrad       ? a.stage - 1
                                                    : a.stage;
  return (boundary * microbatches + a.microbatch) * 2 + (activation ? 0 : 1);
}

Lane lane_of(const Action& a, int rank) {
  TORCH_CHECK(is_transfer(a.op) && a.peer >= 0 && a.peer != rank, "lane_of: ", to_string(a), " on rank ", rank,
              " is no send or receive between two ranks");
  const bool activation = a.op == Op::SendActivation || a.op == Op::RecvActivation;
  const bool sending = a.op == Op::SendActivation || a.op == Op::SendGrad;
  const int from = sending ? rank : a.peer, to = sending ? a.peer : rank;
  if (activation) return to > from ? Lane::kActivationUp : Lane::kActivationDown;
  return to > from ? Lane::kGradUp : Lane::kGradDown;
}

std::string lane_order_problem(const std::vector<std::vector<Action>>& lists, int microbatches) {
  // (lane, rank, peer) -> what the rank posts with the peer on the lane, in
  // order: +message for a send, -message - 1 for a receive.
  std::map<std::tuple<int, int, int>, std::vector<int>> posted;
  for (int r = 0; r < int(lists.size()); ++r) {
    for (const Action& a : lists[size_t(r)]) {
      if (!is_transfer(a.op)) continue;
      const bool sending = a.op == Op::SendActivation || a.op == Op::SendGrad;
      const int m = message_of(a, microbatches);
      posted[{int(lane_of(a, r)), r, a.peer}].push_back(sending ? m : -m - 1);
    }
  }
  // The k-th operation one end posts must meet the k-th the other posts:
  // a send its receive.
  for (const auto& [key, mine] : posted) {
    const auto& [lane, r, q] = key;
    if (q < r) continue;  // each pair once
    const auto it = posted.find({lane, q, r});
    const std::vector<int> none;
    const auto& theirs = it == posted.end() ? none : it->second;
    for (size_t k = 0; k < std::max(mine.size(), theirs.size()); ++k) {
      if (k < mine.size() && k < theirs.size() && mine[k] == -theirs[k] - 1) continue;
      const auto say = [](const std::vector<int>& v, size_t k) {
        return k >= v.size() ? std::string("nothing")
               : v[k] >= 0   ? c10::str("send ", v[k])
                             : c10::str("receive ", -v[k] - 1);
      };
      return c10::str("lane ", lane, ", ranks ", r, " and ", q, ": operation ", k, " is ", say(mine, k), " on rank ",
                      r, " but ", say(theirs, k), " on rank ", q);
    }
  }
  return "";
}

}  // namespace strata::pp
