#pragma once
// What strata-bench runs a model family on (ModelSpec::bench): the presets
// of its suites, the planner suite's held-out cases and the job against the
// family's PyTorch program in the peer suite. The suites keep no model names
// of their own: the strategy suites (smoke, zero, memory, tp, attention,
// kernels, scale, a strategy's own) run the first registered family that
// gives workloads (the GPT, for the built-ins); the planner and peer suites
// run every family that gives theirs.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace strata::recipes {

/// A preset as a suite runs it: samples per rank and steps. Sized so that a
/// step takes ~0.1-0.4 s on 2 idle cores and a case ~5-20 s.
struct BenchWorkload {
  std::string preset;  ///< "": none
  int64_t batch = 16;
  int64_t steps = 60;
};

/// A planner-suite case held out from the planner constants' fit (another
/// width, block, batch or world size).
struct HeldOutPlannerCase {
  std::string preset;
  /// The planner suite's variant by position (the built-in strategies':
  /// 0 ddp, 1 oss, 2 sdp, 3 fsdp, 4 fsdp + activation checkpointing).
  size_t variant = 0;
  int nproc = 2;
  int64_t block = 128, batch = 8;
  std::vector<std::string> flags = {};  ///< model flags ({"--n-embd", "192"})
  std::string tag = "";                 ///< the flags in the case's name ("w192")
};

/// The family's jobs in the peer suite: strata against the family's PyTorch
/// program (bench/peers/gpt_peer.py runs it) from the same initial weights.
struct PeerWorkload {
  std::string preset;              ///< "": no peer jobs
  std::string init_format = "pt";  ///< BenchCase::shared_init_format
  /// The strategies' PyTorch counterparts (StrategySpec::pytorch_peer) the
  /// peer runs, fp32 and bf16-mixed ({}: every one).
  std::vector<std::string> modes = {};
  /// Those with an fp32 activation-checkpointing job too ({}: every one).
  std::vector<std::string> ac_modes = {};
  /// The single-process job with op-level selective checkpointing too.
  bool op_sac = false;
  /// The single-process job on the wide shape (BenchWorkloads::wide_flags)
  /// at block 256, batch 4.
  bool wide = false;
};

struct BenchWorkloads {
  /// The CI gate's (smoke suite, block 64): tiny matmuls, milliseconds a step.
  BenchWorkload tiny;
  /// A strategy's own suite runs small and medium; zero, memory, tp,
  /// attention and kernels run medium.
  BenchWorkload small, medium;
  /// Medium widened, for the kernels and peer suites: the model flags and the
  /// tag that names them in a case ("384").
  std::vector<std::string> wide_flags = {};
  std::string wide_tag = "";
  /// The scale suite's presets, smallest first.
  std::vector<std::string> scale = {};
  /// The planner suite's presets the constants were fitted on.
  std::vector<std::string> planner = {};
  std::vector<HeldOutPlannerCase> planner_held_out = {};
  /// `strata-bench --suite checkpoint`'s default presets.
  std::vector<std::string> checkpoint = {};
  PeerWorkload peer = {};
};

}  // namespace strata::recipes
