#include "strata/bench/phase_split.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>

namespace strata::bench {
namespace {

const std::string kGemm = "GEMM", kAttention = "attention", kElementwise = "element-wise & other ops",
                  kOptimizer = "optimizer", kWait = "comm & I/O wait", kAllocation = "allocation",
                  kOutside = "outside ops";

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

struct Event {
  double start = 0.0, end = 0.0;  // microseconds
  std::string name;
  bool scope = false;  ///< a user scope (torch.profiler.record_function, FSDP2's "FSDP::..."), not an op
};

/// The ops of one thread, each with the time of its direct children.
struct Node {
  const Event* event;
  double children_us = 0.0;
  bool inside_enclosing = false;
};

bool is_op(const nlohmann::json& e) {
  if (!e.is_object() || e.value("ph", "") != "X" || !e.contains("dur") || !e.contains("ts")) return false;
  const std::string cat = e.value("cat", "");
  // CPU ops and user scopes (RECORD_FUNCTION, torch.profiler.record_function);
  // not GPU kernels, memcpys or the profiler's own markers.
  return cat == "cpu_op" || cat == "user_annotation" || cat.empty();
}

}  // namespace

const std::vector<std::string>& phase_names() {
  static const std::vector<std::string> names{kGemm,      kAttention, kElementwise, kOptimizer,
                                              kWait,      kAllocation, kOutside};
  return names;
}

OpPhase phase_of(const std::string& op_name) {
  const std::string n = lower(op_name);
  if (n.find("attention") != std::string::npos) return {kAttention, true};
  if (n.find("optimizer_step") != std::string::npos || n.rfind("optimizer.step", 0) == 0) return {kOptimizer, true};
  if (n.find("wait") != std::string::npos || n.find("offload_read") != std::string::npos ||
      n.find("offload_write") != std::string::npos) {
    return {kWait, true};
  }
  static const std::set<std::string> gemm{"aten::mm",     "aten::addmm",  "aten::bmm",    "aten::baddbmm",
                                          "aten::addbmm", "aten::mv",     "aten::addmv",  "aten::dot",
                                          "aten::linear", "aten::matmul", "aten::_addmm_activation"};
  if (gemm.count(n) || n.find("gemm") != std::string::npos) return {kGemm, false};
  static const std::set<std::string> allocation{"aten::empty",     "aten::empty_strided", "aten::empty_like",
                                                "aten::new_empty", "aten::new_empty_strided", "aten::resize_"};
  if (allocation.count(n)) return {kAllocation, false};
  return {kElementwise, false};
}

nlohmann::json PhaseSplit::to_json() const {
  nlohmann::json j;
  j["steps"] = steps;
  j["step_ms"] = step_ms;
  j["ms_per_step"] = ms_per_step;
  return j;
}

PhaseSplit PhaseSplit::from_json(const nlohmann::json& j) {
  PhaseSplit s;
  s.steps = j.at("steps").get<int64_t>();
  s.step_ms = j.at("step_ms").get<double>();
  s.ms_per_step = j.at("ms_per_step").get<std::map<std::string, double>>();
  return s;
}

PhaseSplit phase_split(const nlohmann::json& trace, int64_t steps) {
  TORCH_CHECK_VALUE(steps >= 1, "phase_split: steps must be >= 1, got ", steps);
  TORCH_CHECK_VALUE(trace.is_object() && trace.contains("traceEvents") && trace.at("traceEvents").is_array(),
                    "phase_split: not a Chrome trace (no traceEvents array)");
  std::map<std::string, std::vector<Event>> threads;  // by "pid/tid"
  for (const auto& e : trace.at("traceEvents")) {
    if (!is_op(e)) continue;
    const double ts = e.at("ts").get<double>(), dur = std::max(0.0, e.at("dur").get<double>());
    threads[e.value("pid", nlohmann::json(0)).dump() + "/" + e.value("tid", nlohmann::json(0)).dump()].push_back(
        {ts, ts + dur, e.value("name", ""), e.value("cat", "") == "user_annotation"});
  }
  TORCH_CHECK_VALUE(!threads.empty(), "phase_split: the trace has no CPU ops");

  PhaseSplit split;
  split.steps = steps;
  for (const auto& name : phase_names()) split.ms_per_step[name] = 0.0;
  double best_top = -1.0;
  std::map<std::string, double> best;
  double best_span = 0.0;
  for (auto& [tid, events] : threads) {
    // Outer before inner: by start, the longer first.
    std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
      return a.start != b.start ? a.start < b.start : a.end > b.end;
    });
    std::map<std::string, double> us;
    std::vector<Node> stack;
    double top_us = 0.0;
    auto close = [&](const Node& node) {
      if (node.inside_enclosing) return;
      const OpPhase p = phase_of(node.event->name);
      const double dur = node.event->end - node.event->start;
      // A scope's own time is no op's: Python, hooks, waits it did not record.
      const std::string& phase = node.event->scope && !p.encloses ? kOutside : p.phase;
      us[phase] += p.encloses ? dur : std::max(0.0, dur - node.children_us);
    };
    for (const Event& e : events) {
      while (!stack.empty() && e.start >= stack.back().event->end) {
        close(stack.back());
        stack.pop_back();
      }
      Node node{&e};
      if (stack.empty()) {
        top_us += e.end - e.start;
      } else {
        Node& parent = stack.back();
        parent.children_us += std::min(e.end, parent.event->end) - e.start;
        node.inside_enclosing = parent.inside_enclosing || phase_of(parent.event->name).encloses;
      }
      stack.push_back(node);
    }
    for (auto it = stack.rbegin(); it != stack.rend(); ++it) close(*it);
    if (top_us > best_top) {  // the main thread: the most op time
      best_top = top_us;
      best = us;
      best_span = events.back().end - events.front().start;
      for (const Event& e : events) best_span = std::max(best_span, e.end - events.front().start);
      best[kOutside] += std::max(0.0, best_span - top_us);
    }
  }
  split.step_ms = best_span / 1e3 / static_cast<double>(steps);
  for (const auto& [phase, micros] : best) split.ms_per_step[phase] = micros / 1e3 / static_cast<double>(steps);
  return split;
}

PhaseSplit phase_split_file(const std::string& path, int64_t steps) {
  std::ifstream in(path);
  TORCH_CHECK_VALUE(in.good(), "phase_split: cannot read the trace ", path);
  nlohmann::json trace;
  try {
    trace = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK_VALUE(false, "phase_split: ", path, " is not JSON: ", e.what());
  }
  try {
    return phase_split(trace, steps);
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false, path, ": ", e.what_without_backtrace());
  }
}

}  // namespace strata::bench
