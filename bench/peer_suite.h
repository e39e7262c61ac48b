#pragma once
// The peer suite: strata against the PyTorch 2.x program a user would write
// for the same job (bench/peers/gpt_peer.py), case by case: the same model,
// data, global batch, initial weights (shared_init) and thread settings;
// PyTorch eager and torch.compile. Each registered family says its jobs
// (recipes/models/bench_workloads.h). The built-ins: on the GPT single,
// ddp x2, oss x2 against ZeroRedundancyOptimizer x2, fsdp x2 against FSDP2
// fully_shard x2, fp32 and bf16-mixed, activation checkpointing (fp32), and a
// 384-wide gpt-mini at block 256; on the Llama, transformers'
// LlamaForCausalLM single, DDP and FSDP2, and FSDP2 with checkpointing.
#include "strata/bench/charts.h"
#include "strata/bench/harness.h"
#include "strata/recipes/models/spec.h"

#include <string>
#include <vector>

namespace strata::bench {

/// Every registered family's peer jobs (BenchWorkloads::peer), each as three
/// cases: strata, PyTorch eager, PyTorch compiled.
Suite peer_suite(const StrategyRegistry& registry, const recipes::ModelRegistry& models);

/// Loss agreement needed for a comparison to count: |strata − PyTorch| of the
/// final training loss (fp32: the same math in another order; bf16: rounding
/// of two different autocast op sets).
double peer_loss_tolerance(const std::string& precision);

/// Markdown: per job, strata's tokens/s and PyTorch's eager and compiled
/// (median, min–max), strata ÷ the faster PyTorch (median and the range over
/// repeats), peak RSS per rank, loopback bytes per step, the final losses
/// and whether they agree (a comparison whose losses disagree is void).
std::string peer_markdown(const std::vector<CaseResult>& results, const StrategyRegistry& registry,
                                         const recipes::ModelRegistry& models);

/// The chart of the same: a panel per model and precision (fp32, bf16-mixed,
/// fp32 + activation checkpointing; the widened model), a
/// cluster per strategy, bars strata / PyTorch eager / PyTorch compiled, each
/// tokens/s ÷ the faster PyTorch's (1 = PyTorch's best).
PanelChart peer_chart_data(const std::vector<CaseResult>& results, const StrategyRegistry& registry,
                                         const recipes::ModelRegistry& models);

/// The same panels and bars, each the system's share of the job's GEMM-bound
/// ceiling (strata's summary.json ceiling, recipes/app/gemm_ceiling.h: one
/// ceiling per job for all three programs; 1 = every FLOP at the rate of the
/// model's own matrix products). Jobs without a ceiling are left out.
PanelChart peer_ceiling_chart_data(const std::vector<CaseResult>& results, const StrategyRegistry& registry,
                                         const recipes::ModelRegistry& models);

}  // namespace strata::bench
