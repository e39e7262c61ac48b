#pragma once
// Where a training step's time goes, by kind of work, from a Chrome trace of a
// few steps: strata-gpt --profile DIR writes one per rank (Kineto, through
// callbacks/profiler.h), and so does the PyTorch peer (gpt_peer.py --profile,
// torch.profiler). One set of rules reads both, so the two programs' splits
// compare.
//
// Only the main thread counts (the one with the most op time: the forward,
// the backward, which LibTorch runs on the calling thread for CPU, and the
// step). Its ops nest; each microsecond of its traced span goes to one phase:
//  - an op that *is* a phase takes its whole time, children included:
//    attention (any name containing "attention": strata's kernel and its
//    backward node, PyTorch's SDPA ops), optimizer (strata::optimizer_step,
//    torch.optim's "Optimizer.step#..."), comm & I/O wait (any name with
//    "wait": strata::comm_wait, FSDP2's "FSDP::post_backward_rs_wait"; and
//    strata::offload_read / offload_write);
//  - otherwise an op's own time (less its children's) goes by its name: GEMM
//    (aten::mm, addmm, bmm, baddbmm, ... and the linear/matmul wrappers),
//    allocation (aten::empty*, resize_), else element-wise & other ops
//    (element-wise, reductions, casts, copies, LayerNorm, the loss, and a
//    compiled region's own time: Inductor's fused kernels run in it
//    unrecorded);
//  - "outside ops": the span's time in no op (hooks, the autograd engine
//    between nodes, Python), and the own time of scopes, which are not ops:
//    torch.profiler's user scopes (FSDP2's "FSDP::pre_forward": its Python
//    and the waits it issues) and strata's "strata::..." spans alike.
// What a program does not record is invisible to it: PyTorch's Gloo waits
// issued from Python (FSDP2's all-gathers, DDP's reducer) land in outside ops
// or in the op around them, not in comm wait.
//
//   auto split = phase_split_file("prof/trace-rank0.json", 3);
//   split.ms_per_step.at("GEMM");
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace strata::bench {

/// The phases, in report order.
const std::vector<std::string>& phase_names();

/// The phase an op's own time goes to, by its name (one of phase_names(),
/// never "outside ops"); `encloses` says whether its children go with it.
struct OpPhase {
  std::string phase;
  bool encloses = false;
};
OpPhase phase_of(const std::string& op_name);

struct PhaseSplit {
  int64_t steps = 0;
  double step_ms = 0.0;  ///< the main thread's traced span ÷ steps
  /// Per phase (every name in phase_names()), ms per step; they sum to step_ms.
  std::map<std::string, double> ms_per_step;
  nlohmann::json to_json() const;
  static PhaseSplit from_json(const nlohmann::json& j);
};

/// The split of a Chrome trace ({"traceEvents": [...]}) covering `steps` steps.
PhaseSplit phase_split(const nlohmann::json& trace, int64_t steps);
/// The same, read from a file; errors name the file.
PhaseSplit phase_split_file(const std::string& path, int64_t steps);

}  // namespace strata::bench
