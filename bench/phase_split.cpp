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
  bool scope = false;  ///< a span around ops, not an op itself (see is_scope)
};

/// An event on the stack of its thread: its end clamped to its parent's (a
/// child that overhangs by a rounding error must not swallow the parent's
/// next sibling), its phase, and the time of its direct children.
struct Node {
  const Event* event;
  double end;
  OpPhase phase;
  bool inside_enclosing = false;
  double children_us = 0.0;
};

/// One thread's time by phase (µs), its top-level op time and its span.
struct ThreadSplit {
  std::map<std::string, double> us;
  double top_us = 0.0, span_us = 0.0;
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

namespace {

/// Whether an event is a scope, whose own time is no op's: torch.profiler's
/// user scopes (FSDP2's "FSDP::pre_forward": its Python, the waits it does
/// not record) and strata's own RECORD_FUNCTION spans (strata::fsdp_gather:
/// issuing collectives, picking buffers), alike for both programs. Not a
/// compiled region ("Torch-Compiled Region", "## Call CompiledFxGraph ...",
/// CompiledFunction): Inductor's fused kernels run inside it unrecorded, so
/// its own time is element-wise work.
bool is_scope(const std::string& name, const std::string& category) {
  if (lower(name).find("compiled") != std::string::npos) return false;
  return category == "user_annotation" || name.rfind("strata::", 0) == 0;
}

ThreadSplit thread_split(std::vector<Event>& events) {
  // Outer before inner: by start, the longer first; stable, so that equal
  // spans (µs rounding) nest in the order they were recorded.
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.start != b.start ? a.start < b.start : a.end > b.end;
  });
  ThreadSplit out;
  std::vector<Node> stack;
  auto close = [&](const Node& node) {
    if (node.inside_enclosing) return;
    const double dur = node.end - node.event->start;
    if (node.phase.encloses) {
      out.us[node.phase.phase] += dur;
      return;
    }
    // A scope's own time is no op's: it goes with the time between ops.
    out.us[node.event->scope ? kOutside : node.phase.phase] += std::max(0.0, dur - node.children_us);
  };
  double first = events.empty() ? 0.0 : events.front().start, last = first;
  for (const Event& e : events) {
    while (!stack.empty() && e.start >= stack.back().end) {
      close(stack.back());
      stack.pop_back();
    }
    Node node{&e, e.end, phase_of(e.name)};
    if (stack.empty()) {
      out.top_us += e.end - e.start;
    } else {
      Node& parent = stack.back();
      node.end = std::min(e.end, parent.end);
      parent.children_us += node.end - e.start;
      node.inside_enclosing = parent.inside_enclosing || parent.phase.encloses;
    }
    last = std::max(last, node.end);
    stack.push_back(node);
  }
  for (auto it = stack.rbegin(); it != stack.rend(); ++it) close(*it);
  out.span_us = last - first;
  out.us[kOutside] += std::max(0.0, out.span_us - out.top_us);
  return out;
}

}  // namespace

PhaseSplit phase_split(const nlohmann::json& trace, int64_t steps) {
  TORCH_CHECK_VALUE(steps >= 1, "phase_split: steps must be >= 1, got ", steps);
  TORCH_CHECK_VALUE(trace.is_object() && trace.contains("traceEvents") && trace.at("traceEvents").is_array(),
                    "phase_split: not a Chrome trace (no traceEvents array)");
  std::map<std::string, std::vector<Event>> threads;  // by "pid/tid"
  try {
    for (const auto& e : trace.at("traceEvents")) {
      if (!is_op(e)) continue;
      const double ts = e.at("ts").get<double>(), dur = std::max(0.0, e.at("dur").get<double>());
      const std::string name = e.value("name", ""), category = e.value("cat", "");
      threads[e.value("pid", nlohmann::json(0)).dump() + "/" + e.value("tid", nlohmann::json(0)).dump()].push_back(
          {ts, ts + dur, name, is_scope(name, category)});
    }
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK_VALUE(false, "phase_split: an event with a field of the wrong type: ", e.what());
  }
  TORCH_CHECK_VALUE(!threads.empty(), "phase_split: the trace has no CPU ops");
  ThreadSplit main;  // the thread with the most op time
  for (auto& [tid, events] : threads) {
    ThreadSplit t = thread_split(events);
    if (t.top_us > main.top_us) main = std::move(t);
  }
  PhaseSplit split;
  split.steps = steps;
  split.step_ms = main.span_us / 1e3 / static_cast<double>(steps);
  for (const auto& name : phase_names()) split.ms_per_step[name] = 0.0;
  for (const auto& [phase, micros] : main.us) split.ms_per_step[phase] = micros / 1e3 / static_cast<double>(steps);
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
