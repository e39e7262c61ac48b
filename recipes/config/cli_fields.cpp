#include "strata/recipes/config/cli_fields.h"

namespace strata::recipes {

std::vector<std::string> group_titles() {
  return {"Model", "Data", "Strategy and launch", "Optimisation", "Loop and outputs", "Python interop",
          "Testing aids"};
}

/// Printed by --help-all after the testing options: fault injection read from
/// the environment (recipes/app/run.cpp, trainer/checkpoint.cpp, strategies/offload_tier.cpp).
const char* const kTestingEnvironment =
    "Testing aids in the environment:\n"
    "  STRATA_TEST_FAIL_AT_STEP=S    rank R throws at the start of step S\n"
    "  STRATA_TEST_FAIL_RANK=R       (default 0; failure-handling tests)\n"
    "  STRATA_TEST_KILL_AT_STEP=S    rank R SIGKILLs itself at the start of step S; with\n"
    "  STRATA_TEST_KILL_RANK=R       STRATA_TEST_KILL_ONCE=FILE only while FILE does not exist\n"
    "                                (it creates it first: a restarted job runs on; restart tests)\n"
    "  STRATA_TEST_SKIP_COLLECTIVE=N rank R does not issue its N-th collective of the world\n"
    "  STRATA_TEST_SKIP_RANK=R       (default 0), as a rank with a control-flow bug would (the\n"
    "                                flight recorder's mismatch tests)\n"
    "  STRATA_CHECKPOINT_KILL_AT=P[@R][/S]  the process SIGKILLs itself at checkpoint point P\n"
    "                                (after-shard, before-metadata, before-rename), on rank R,\n"
    "                                at step S (crash-consistency tests; trainer/checkpoint.h)\n"
    "  STRATA_TEST_OFFLOAD_NO_TMPFILE=1  --offload disk uses its named-file fallback, as on a\n"
    "                                filesystem without O_TMPFILE (strategies/offload_tier.cpp)";

namespace {

/// Model and data options (groups 0, 1). The model families' own options
/// (recipes/models/spec.h) follow preset (cli.cpp inserts them).
std::vector<Field> model_data_fields() {
  using C = RunConfig;
  return {
      {"preset", 0, &C::preset, "model preset"},
      {"block-size", 0, &C::block_size, "context length (0: the data's natural length)"},
      {"data", 1, &C::data,
       "addition, addition:N, a dir with train.bin/val.bin, or text: a text file, a .jsonl file of {\"text\": ...} "
       "records, or a directory of them (with a tokenizer tokenized once into a cache beside it, docs/data.md; "
       "without one, a text file is read as bytes)"},
      {"tokenizer", 1, &C::tokenizer,
       "a tokenizer.json, or a directory holding one, for text data (default: --init-from's, if it has one; "
       "none: bytes)"},
      {"val-data", 1, &C::val_data, "held-out text or JSONL, tokenized as --data (default: the last 10% of --data)"},
      {"prompt-style", 1, &C::prompt_style,
       "instruction data (.json, or .jsonl of {instruction, input, output} or {messages}): alpaca, llama3, chatml, "
       "qwen3, mistral, zephyr, phi3, or auto (the tokenizer's chat template's)"},
      {"mask-prompt", 1, &C::mask_prompt, "instruction data: leave the prompt's tokens out of the loss"},
      {"eval-only", 1, &C::eval_only,
       "score the model (--init-from, --resume, or its init) on --val-data, or on all of text or instruction "
       "--data, and stop: the loss and perplexity, each sample once; no step is taken", true},
      {"vocab-size", 1, &C::vocab_size, "vocabulary size (nanoGPT .bin data only)"},
  };
}

/// Strategy and launch options (group 2). The registered strategies' own
/// options (strategies/spec.h) follow comm-timeout (cli.cpp inserts them).
std::vector<Field> launch_fields() {
  using C = RunConfig;
  return {
      {"strategy", 2, &C::strategy, "distributed strategy"},
      {"device", 2, &C::device, "auto (cuda:LOCAL_RANK when CUDA is usable, else cpu), cpu or cuda"},
      {"nproc", 2, &C::nproc, "ranks to launch on this machine"},
      {"tp-size", 2, &C::tp_size,
       "tensor-parallel ranks per group (Megatron-style: heads, MLP and vocabulary split over them); --strategy "
       "runs over the world / tp-size data-parallel groups, consecutive ranks form a tensor-parallel group "
       "(1: off)"},
      {"sequence-parallel", 2, &C::sequence_parallel,
       "--tp-size > 1: LayerNorm, dropout and residual activations split along the sequence (all-gather and "
       "reduce-scatter in place of each all-reduce)", true},
      {"pp-size", 2, &C::pp_size,
       "pipeline stages' ranks: the model's blocks split into stages on different ranks (the first also the "
       "embedding, the last the head), each step's micro-batches (--accumulate-grad-batches) streamed through "
       "them by --pp-schedule (1: off; docs/pipeline.md)"},
      {"pp-schedule", 2, &C::pp_schedule,
       "--pp-size > 1: gpipe, 1f1b, interleaved-1f1b (with --pp-virtual-stages; micro-batches a multiple of "
       "--pp-size) or zero-bubble (ZB-H1); torchtitan's names GPipe, 1F1B, Interleaved1F1B, ZBH1 too"},
      {"pp-virtual-stages", 2, &C::pp_virtual_stages,
       "--pp-size > 1: stages per rank (interleaved-1f1b: > 1; the others: 1)"},
      {"pp-split", 2, &C::pp_split,
       "--pp-size > 1: blocks per stage, e.g. 3,3,2 (default: balanced by parameters, the embedding and the head "
       "counted)"},
      {"nnodes", 2, &C::nnodes, "machines, each running strata-gpt with the same flags but --node-rank"},
      {"node-rank", 2, &C::node_rank, "this machine's index in [0, nnodes); node 0 hosts rank 0"},
      {"threads-per-rank", 2, &C::threads_per_rank, "intra-op threads per rank (0: cores / ranks)"},
      {"master-addr", 2, &C::master_addr, "node 0's address (one machine: Gloo binds to the interface that reaches it)"},
      {"master-port", 2, &C::master_port, "rank 0's store port with --nnodes > 1 (one machine meets in a file, no port)"},
      {"flight-recorder", 2, &C::flight_recorder,
       "collectives each rank keeps for its flight-recorder dump (<output-dir>/flight/rank<R>.json, "
       "written on a failure or SIGUSR1; strata-flight reads them; 0: off)"},
      {"comm-timeout", 2, &C::comm_timeout_s, "collective timeout in seconds"},
      {"offload", 2, &C::offload,
       "where state lives between uses, the optimizer step streaming it (each strategy says what moves: "
       "fsdp its parameter shards, gradients and optimizer state; single, ddp, oss, sdp the optimizer "
       "state): none, cpu (pinned host memory; CUDA devices only), disk (an unnamed file in "
       "--offload-dir, gone when the run ends)"},
      {"offload-dir", 2, &C::offload_dir,
       "--offload disk: an existing directory for the offload file (default: --output-dir)"},
      {"activation-checkpointing", 2, &C::activation_checkpointing,
       "recompute blocks in backward instead of keeping activations: 0 off, 1 every block, "
       "n every n-th (blocks 0, n, 2n, ...)"},
      {"ac-policy", 2, &C::ac_policy,
       "what a checkpointed block keeps besides its input, so its recompute skips those ops: full (nothing), "
       "attention (the fused CPU attention's output and logsumexp), op (attention's and every other matmul's "
       "outputs, as torchtitan's op-level SAC; more memory, less recompute)"},
      {"memory-budget", 2, &C::memory_budget,
       "--strategy auto: bytes per rank the chosen strategy must fit, e.g. 4GiB or 512MiB (default: "
       "available memory / local ranks; CUDA: the GPU's memory)"},
      {"dry-run", 2, &C::dry_run,
       "build the strategy's real sharding plan for --nproc x --nnodes ranks in this one process (a fake process "
       "group, meta tensors: no data, no memory) and print each rank's layout, memory and every collective of a "
       "step with its bytes; trains nothing, writes nothing", true},
      {"no-memory-check", 2, &C::no_memory_check,
       "skip the pre-flight check that refuses a run whose predicted peak memory exceeds what this "
       "machine has available", true},
      {"cpu-cache", 2, &C::cpu_cache,
       "keep freed CPU blocks of 64 KiB and more for reuse, trimmed every step to what the step "
       "reused (false: back to the system at once, each step's large tensors fresh pages)"},
  };
}

/// Optimisation options (group 3).
std::vector<Field> optimisation_fields() {
  using C = RunConfig;
  return {
      {"max-steps", 3, &C::max_steps, "optimizer steps"},
      {"batch-size", 3, &C::batch_size, "samples per micro-batch per rank"},
      {"accumulate-grad-batches", 3, &C::accumulate_grad_batches, "micro-batches per step"},
      {"optimizer", 3, &C::optimizer,
       "adamw (decoupled weight decay; --adam-beta1/2, --adam-eps) or sgd (L2 weight decay; --momentum, "
       "--nesterov); both decay >= 2-D weights only"},
      {"adam-beta1", 3, &C::adam_beta1, "adamw: the first moment's decay, in [0, 1)"},
      {"adam-beta2", 3, &C::adam_beta2, "adamw: the second moment's decay, in [0, 1)"},
      {"adam-eps", 3, &C::adam_eps, "adamw: added to the second moment's square root (> 0)"},
      {"momentum", 3, &C::momentum, "sgd: momentum, in [0, 1) (0: plain SGD)"},
      {"nesterov", 3, &C::nesterov, "sgd: Nesterov momentum (needs --momentum > 0)", true},
      {"fused-adamw", 3, &C::fused_adamw,
       "adamw: one fused, vectorised pass per parameter (same math and state as "
       "torch::optim::AdamW, which false selects)"},
      {"adamw-kernel", 3, &C::adamw_kernel,
       "fused-adamw: strata (kernels/fused_adamw.h, the faster here) or aten (ATen's _fused_adamw_, "
       "what PyTorch's AdamW(fused=True) runs)"},
      {"lr", 3, &C::lr, "peak learning rate"},
      {"min-lr", 3, &C::min_lr, "final learning rate of the decay"},
      {"warmup-steps", 3, &C::warmup_steps, "linear warm-up steps"},
      {"weight-decay", 3, &C::weight_decay, "weight decay (adamw: decoupled, sgd: L2)"},
      {"gradient-clip-val", 3, &C::gradient_clip_val, "global gradient norm limit (0: off)"},
      {"precision", 3, &C::precision,
       "32 (32-true, fp32), bf16-mixed (bf16) or 16-mixed (fp16-mixed, fp16: fp16 compute with loss scaling)"},
      {"loss-scale", 3, &C::loss_scale, "16-mixed: 0 for dynamic loss scaling, or a static scale"},
      {"initial-scale-power", 3, &C::initial_scale_power, "16-mixed, dynamic: the first loss scale is 2^this"},
      {"loss-scale-window", 3, &C::loss_scale_window,
       "16-mixed, dynamic: steps without overflow before the scale doubles"},
      {"hysteresis", 3, &C::hysteresis,
       "16-mixed, dynamic: overflows (each skips its step) before the scale halves"},
      {"consecutive-hysteresis", 3, &C::consecutive_hysteresis,
       "16-mixed, dynamic: a step without overflow restores the full hysteresis"},
      {"min-loss-scale", 3, &C::min_loss_scale,
       "16-mixed, dynamic: the lowest scale; an overflow there stops the run with an error"},
      {"seed", 3, &C::seed, "random seed"},
  };
}

/// Loop and outputs options (group 4).
std::vector<Field> loop_fields() {
  using C = RunConfig;
  return {
      {"log-every-n-steps", 4, &C::log_every_n_steps, "log every N steps"},
      {"val-check-interval", 4, &C::val_check_interval, "validate every N steps (0: at the end)"},
      {"limit-val-batches", 4, &C::limit_val_batches, "validation batches per check (0: none)"},
      {"output-dir", 4, &C::output_dir, "logs, config.ini and checkpoints go here"},
      {"checkpoint-every", 4, &C::checkpoint_every, "checkpoint every N steps (0: never)"},
      {"checkpoint-keep", 4, &C::checkpoint_keep, "newest checkpoints to keep (0: all)"},
      {"checkpoint-format", 4, &C::checkpoint_format,
       "full (rank 0 writes one consolidated file) | sharded (one file per rank) | auto (sharded for "
       "oss/sdp/fsdp, else full); either loads under any strategy and world size"},
      {"checkpoint-monitor", 4, &C::checkpoint_monitor,
       "also keep the best checkpoints by this metric: val_loss, val_accuracy or loss (train loss); "
       "every step it is measured at and would rank among the best is saved (\"\": off)"},
      {"checkpoint-mode", 4, &C::checkpoint_mode, "with --checkpoint-monitor: min or max is better"},
      {"checkpoint-keep-best", 4, &C::checkpoint_keep_best,
       "with --checkpoint-monitor: best checkpoints to keep (never pruned by --checkpoint-keep); "
       "<output-dir>/checkpoints/best names the best"},
      {"checkpoint-async", 4, &C::checkpoint_async,
       "snapshot each checkpoint into host memory (one copy of the rank's state) and write it on a "
       "thread while training goes on (sharded format); the next save waits for the previous", true},
      {"early-stopping-patience", 4, &C::early_stopping_patience,
       "validations without improvement before stopping (0: off)"},
      {"resume", 4, &C::resume,
       "checkpoint directory to resume from, 'last' (the newest in <output-dir>/checkpoints) or 'auto' "
       "(the newest complete one, or a fresh start when there is none: one command for a job's first start "
       "and every restart); continues exactly, appending to <output-dir>/metrics.csv"},
      {"profile", 4, &C::profile,
       "write a Chrome trace of steps 3-5 per rank to DIR/trace-rank<R>.json (Kineto; open in "
       "ui.perfetto.dev or chrome://tracing)"},
      {"peak-flops", 4, &C::peak_flops,
       "one rank's peak FLOP/s, the MFU denominator (0: measured once per machine, threads and dtype, "
       "cached in ~/.cache/strata/peak_flops.json)"},
      {"progress-bar", 4, &C::progress_bar, "live progress bar on a TTY", true},
  };
}

/// Python interop options and testing aids (groups 5, 6).
std::vector<Field> interop_testing_fields() {
  using C = RunConfig;
  return {
      {"init-from", kInteropGroup, &C::init_from,
       "start from these weights: a model directory (transformers' or an export; it gives the model) or, for "
       "the GPT, a file under nanoGPT's names (a torch.save'd state_dict, a nanoGPT ckpt.pt, an --export-weights "
       "file); with --resume the checkpoint's weights replace them"},
      {"init-adapter", kInteropGroup, &C::init_adapter,
       "with --init-from a Llama-family directory: start LoRA from this PEFT adapter directory "
       "(adapter_config.json gives --lora-rank, --lora-alpha and --lora-targets)"},
      {"export-weights", kInteropGroup, &C::export_weights,
       "after training, write the GPT's weights here under nanoGPT's names (Python: torch.load)"},
      {"torchscript", kInteropGroup, &C::torchscript,
       "train this TorchScript model (torch.jit.script(model).save(...)) instead of the GPT; "
       "model options do not apply (see recipes/models/torchscript/torchscript.h for the contract)"},
      {"export-torchscript", kInteropGroup, &C::export_torchscript,
       "with --torchscript: after training, save the trained model here (torch.jit.load)"},
      {"dump-params", kTestingGroup, &C::dump_params,
       "rank 0 saves the final parameters here (torch::save archive; parity tests)"},
      {"debug-extra-param-copy", kTestingGroup, &C::debug_extra_param_copy,
       "every rank keeps an extra fp32 copy of the parameters' size alive for the run (an "
       "injected memory regression: strata-bench's gate test)", true},
      {"debug-overflow-step", kTestingGroup, &C::debug_overflow_step,
       "at this step the last rank's loss gradient is multiplied by 1e6 on its way back, so 16-mixed "
       "gradients overflow (0: never)"},
  };
}

}  // namespace

/// Every RunConfig field, in to_ini() and --help order.
std::vector<Field> fields() {
  std::vector<Field> all;
  for (auto group : {model_data_fields, launch_fields, optimisation_fields, loop_fields, interop_testing_fields}) {
    auto part = group();
    all.insert(all.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  return all;
}

}  // namespace strata::recipes
