// The "fsdp" strategy (ZeRO-3) as strata describes it (strategies/spec.h).
#include "strata/strategies/fsdp/fully_sharded.h"
#include "strata/strategies/fsdp/hybrid.h"

namespace strata {

namespace {

std::vector<StrategyOption> fsdp_options() {
  return {
      StrategyOption::choice("sharding-strategy", "full_shard", {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard"},
                             "full_shard (params, grads, optimizer state), shard_grad_op (keep units gathered from "
                             "forward to backward), no_shard (DDP-like), hybrid_shard (full_shard inside a node of "
                             "--nproc / LOCAL_WORLD_SIZE ranks, replicated across nodes)"),
      StrategyOption::choice("reshard-after-forward", "auto", {"auto", "true", "false"},
                             "free a unit's full parameters after its forward: auto (full_shard, hybrid_shard: "
                             "every unit but the last, which backward starts with, as torchtitan does; "
                             "shard_grad_op: none), true (every unit), false"),
      StrategyOption::boolean("limit-all-gathers", true, "at most 2 units gathered at once (a prefetch past that waits)"),
      StrategyOption::choice("wrap-policy", "block", {"block", "none"}, "block (each block a unit) or none (one unit)"),
      StrategyOption::choice("reduce-dtype", "fp32", {"fp32", "bf16"},
                             "dtype gradients are reduce-scattered in, fp32 or bf16 (half the bytes); with --precision "
                             "bf16-mixed units are all-gathered in bf16"),
      find_unused_parameters_option(),
  };
}

/// Rules between fsdp's own options (no world needed).
std::string validate_fsdp(const StrategyArgs& a) {
  const std::string& sharding = a.text("sharding-strategy");
  if (a.text("reduce-dtype") == "bf16" && sharding == "no_shard") {
    return "--reduce-dtype bf16 needs sharded gradients (--sharding-strategy full_shard, shard_grad_op or "
           "hybrid_shard), not no_shard";
  }
  if (a.text("reshard-after-forward") == "true" && sharding != "full_shard" && sharding != "hybrid_shard") {
    return "--reshard-after-forward true contradicts --sharding-strategy " + sharding +
           " (which keeps units gathered until their backward); use full_shard or leave it auto";
  }
  return "";
}

FSDPOptions fsdp_options_from(const StrategyArgs& a, const StrategyContext& context) {
  FSDPOptions options;
  options.sharding_strategy(parse_sharding_strategy(a.text("sharding-strategy")))
      .limit_all_gathers(a.boolean("limit-all-gathers"))
      .wrap_policy(parse_wrap_policy(a.text("wrap-policy")))
      .node_size(context.local_world_size)
      .find_unused_parameters(a.boolean("find-unused-parameters"))
      .offload(parse_offload(context.offload))
      .offload_dir(context.offload_dir);
  // Mixed precision: units gathered in the compute dtype (fp32 master shards
  // stay); gradients reduced in --reduce-dtype.
  if (const auto dtype = compute_dtype(context.precision)) options.param_dtype(*dtype);
  if (a.text("reduce-dtype") == "bf16") options.reduce_dtype(torch::kBFloat16);
  const std::string& reshard = a.text("reshard-after-forward");
  if (reshard != "auto") options.reshard_after_forward(reshard == "true");
  return options;
}

/// The ranks that share one copy of the sharded state.
int shard_group(const StrategyArgs& a, int world, int local_world) {
  return a.text("sharding-strategy") == "hybrid_shard" ? local_world : world;
}

std::string check_fsdp(const StrategyArgs& a, const StrategyContext& context) {
  if (a.text("sharding-strategy") == "hybrid_shard") check_hybrid_node_size(context.local_world_size, context.world_size);
  check_offload_options(fsdp_options_from(a, context), context.device,
                        shard_group(a, context.world_size, context.local_world_size));
  return "";
}

/// Model state for every sharding strategy; the peak (what gathers during a
/// step) for full_shard only: the others keep more gathered.
std::optional<MemoryEstimate> fsdp_memory(const MemoryQuery& q) {
  const std::string& sharding = q.args.text("sharding-strategy");
  ModelSize model = q.model;
  if (q.args.text("wrap-policy") == "none") model.units = 0;  // the whole model is the root unit
  const int64_t group = sharding == "no_shard" ? 1 : shard_group(q.args, q.world_size, q.local_world_size);
  const int64_t t = model.trainable, f = model.params - t, shard = ceil_div(t, group);
  MemoryEstimate m;
  // Frozen parameters are sharded too (their own FlatParams), without a
  // gradient or state.
  m.params = 4 * ceil_div(f, group) + 4 * shard;
  m.grads = 4 * shard;
  m.optimizer = q.optimizer_bytes_per_param * shard;
  m.predicts_peak = sharding == "full_shard";
  // Gathered while a unit runs: the root whole for the micro-batch (params
  // and gradient); up to kMaxUnitsGathered units' full params (in the compute
  // dtype), the running unit's full gradient (fp32), and one reduce-scatter in
  // flight (kMaxReductionsInFlight), holding the previous unit's full gradient
  // and a receive buffer of its size. Communication-bound steps reach it;
  // compute-bound ones finish each reduce-scatter early and peak lower.
  const int64_t in_flight = model.units >= 2 ? 8 : 0;
  m.gathered = 4 * (model.root_params() + model.root_trainable()) +
               model.unit_params * std::min<int64_t>(FSDPStrategy::kMaxUnitsGathered, model.units) * q.compute_bytes +
               model.unit_trainable * (4 + in_flight);
  // A scheduled step (a pipeline stage) keeps every unit gathered, in the
  // compute dtype, and every full fp32 gradient until the schedule ends.
  if (q.scheduled_step) m.gathered = model.params * q.compute_bytes + t * 4;
  if (q.offload != "none") {
    // Shards, their gradients and the optimizer state live in the tier
    // (fp32 shard, gradient and two moments; a padding element per rank and unit).
    m.offloaded = 4 * 4 * (ceil_div(model.params, group) + model.units + 1);
    m.params = m.grads = m.optimizer = 0;
  }
  return m;
}

std::optional<CommEstimate> fsdp_comm(const MemoryQuery& q) {
  const std::string& sharding = q.args.text("sharding-strategy");
  const double n = q.world_size, part = (n - 1) / n;
  const double reduce_bytes = q.args.text("reduce-dtype") == "bf16" ? 2.0 : 4.0;
  CommEstimate c;
  if (sharding == "hybrid_shard") return std::nullopt;  // two groups: no single formula
  if (sharding == "no_shard") {
    c.bytes[CollectiveKind::kAllReduce] = 2.0 * part * 4.0 * double(q.model.trainable);
    return c;
  }
  const bool whole_model = q.args.text("wrap-policy") == "none";
  const std::string& reshard = q.args.text("reshard-after-forward");
  // Units gathered again for backward: every unit but the last (auto under
  // full_shard), every unit (true), none (false, shard_grad_op).
  int64_t regathered = 0;
  if (!whole_model && sharding == "full_shard" && reshard == "auto") regathered = std::max<int64_t>(0, q.model.units - 1);
  if (!whole_model && reshard == "true") regathered = q.model.units;
  const double per_micro = double(q.model.params + regathered * q.model.unit_params) * double(q.compute_bytes);
  c.bytes[CollectiveKind::kAllGather] = part * per_micro * double(q.micro_batches);
  c.bytes[CollectiveKind::kReduceScatter] = part * reduce_bytes * double(q.model.trainable);
  return c;
}

}  // namespace

StrategySpec fsdp_spec() {
  return StrategySpec("fsdp",
                      "ZeRO-3: params, grads and optimizer state sharded per wrap unit; all-gather before forward and "
                      "backward, grads reduce-scattered during backward")
      .aliases({"zero3"})
      .options(fsdp_options())
      .validate(validate_fsdp)
      .check(check_fsdp)
      .tensor_parallel(true)
      .factory([](Comm comm, const StrategyArgs& args, const StrategyContext& context) -> std::unique_ptr<Strategy> {
        return std::make_unique<FSDPStrategy>(std::move(comm), fsdp_options_from(args, context));
      })
      .memory(fsdp_memory)
      .communication(fsdp_comm)
      .plan({{.label = "fsdp", .speed_rank = 40, .min_world_size = 2},
             {.label = "fsdp+ac", .speed_rank = 50, .min_world_size = 2, .activation_checkpointing = 1},
             // 2D: where even fsdp+ac does not fit (a layer's activations, a
             // model larger than the ranks' memory), before moving state to disk.
             {.label = "fsdp", .speed_rank = 55, .min_world_size = 2, .tensor_parallel = true},
             {.label = "fsdp+ac",
              .speed_rank = 58,
              .min_world_size = 2,
              .activation_checkpointing = 1,
              .tensor_parallel = true},
             {.label = "fsdp+offload-disk",
              .speed_rank = 60,
              .min_world_size = 2,
              .activation_checkpointing = 1,
              .offload = "disk"}})
      .bench({{.tag = "ac",
               .flags = {"--activation-checkpointing", "1"},
               .suites = {"smoke", "planner"},
               .about = "activation checkpointing of every block"},
              {.tag = "bf16",
               .precision = "bf16-mixed",
               .about = "--precision bf16-mixed: units all-gathered in bf16, fp32 shards and reduce-scatter"},
              {.tag = "offload-disk",
               .flags = {"--offload", "disk"},
               .suites = {"smoke", "scale"},
               .about = "--offload disk: shards, grads and AdamW state in an unnamed file, the step streamed"}})
      .pytorch_peer("fully_shard")
      .deepspeed_zero_stage(3)
      .accelerate_types({"FSDP"});
}

}  // namespace strata
