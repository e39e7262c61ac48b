#pragma once
// ModelSpec: everything strata knows about a model family, in one place, as
// StrategySpec (strategies/spec.h) is for strategies.
//
// A family registers a spec with a ModelRegistry: its name, its presets and
// a factory that resolves a preset and the run's model options (ModelRequest)
// into a ModelConfig. A ModelConfig is one model, resolved: it builds its
// TrainingModule (eager, deferred, or with its weights from a file), counts
// its parameters (total, trainable, per wrap unit, per tensor-parallel rank),
// says its FLOPs per token, the matrix products of one step (the GEMM
// ceiling's shapes), its activation formula, its tensor-parallel limits and
// crossings, and reads and writes its weights in its family's exchange
// format. strata-gpt's checks, the planner, the dry run and the GEMM ceiling
// ask it and keep no model names of their own. The built-in families
// register exactly as a user's does (examples/own_model: a bigram MLP LM).
//
// Example (a user's family):
//   strata::recipes::ModelSpec spec("tiny-mlp", "an MLP language model");
//   spec.presets({"tiny-mlp"})
//       .options({strata::recipes::ModelOption::integer("n-layer", 0, "MLP layers (0: the preset's)").at_least(0)})
//       .factory([](const strata::recipes::ModelRequest& r) {
//     return std::make_shared<TinyMlpConfig>(r.integer("n-layer", 2), r.vocab_size, r.block_size);
//   });
//   registry.add(spec);
#include "strata/core/parameter_ranges.h"
#include "strata/core/precision.h"
#include "strata/core/training_module.h"
#include "strata/recipes/models/bench_workloads.h"
#include "strata/recipes/io/safetensors.h"
#include "strata/recipes/models/lora.h"
#include "strata/strategies/spec.h"
#include "strata/strategies/tp/plan.h"
#include "strata/strategies/tp/spec.h"

#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace strata::recipes {

/// A model option: a key, its kind, its default and its rule, declared as a
/// strategy declares its options (strategies/spec.h). Its default means
/// "the preset's own" (0 sizes) or the family's choice.
using ModelOption = StrategyOption;

/// Tensors by name (as recipes/models/gpt/interop.h).
using NamedTensors = std::map<std::string, torch::Tensor>;

/// `count` matrix products [m, k] x [k, n].
struct GemmShape {
  int64_t m = 0, k = 0, n = 0, count = 1;
  double flops() const { return 2.0 * double(m) * double(k) * double(n) * double(count); }
};

/// Activation bytes of one micro-step of a model of identical blocks, per rank.
struct ActivationProfile {
  int64_t per_block = 0;   ///< kept for backward by one block (its output included)
  int64_t base = 0;        ///< everything else at the backward peak: embeddings, head, logits, loss, transients
  /// The same with every block checkpointed: what one block adds (its input,
  /// kept for the recomputation) and the rest (the head's peak, or one
  /// block's recomputed activations and its backward, whichever is larger).
  int64_t checkpointed_per_block = 0;
  int64_t checkpointed_base = 0;
  bool measured = false;   ///< false: the formula (the probe would have been too large)
  /// Activations of the whole model with every `checkpoint_every`-th block
  /// checkpointed (0: none).
  int64_t total(int64_t n_layer, int64_t checkpoint_every) const;
};

/// Initial values a family's module takes instead of its own init, asked for
/// each parameter when a strategy's setup materialises it: --init-from's
/// weights (ModelConfig::read_weights, which checked them against the
/// model), or the dry run's "keep the meta tensors".
class ParameterSource {
 public:
  virtual ~ParameterSource() = default;
  /// Whether parameter `name` takes its value from here (false: the family
  /// initialises it, e.g. LoRA's adapters, which no file holds).
  virtual bool has(const std::string& name) const = 0;
  /// Elements [begin, end) of `name`'s value, flattened, into `out` (1-D).
  virtual void read(const std::string& name, int64_t begin, int64_t end, const torch::Tensor& out) const = 0;
  /// Whether each rank may read only its parts (files every rank can read):
  /// FSDP then fills each rank's shards straight from here, with no unit
  /// whole in memory and no broadcast (core/parameter_ranges.h). False: each
  /// parameter is read whole and FSDP broadcasts rank 0's values.
  virtual bool serves_parts() const { return false; }
};
using ParameterSourcePtr = std::shared_ptr<const ParameterSource>;

/// `weights` held in memory (a nanoGPT or torch.save file, read whole), each
/// tensor dropped once read whole: after setup no copy of the file stays.
ParameterSourcePtr weights_in_memory(NamedTensors weights);

/// Tensors of safetensors files (by name; extra entries are ignored), read
/// when asked and in parts: each rank reads only the bytes of its shards.
ParameterSourcePtr safetensors_parameters(std::map<std::string, SafetensorsEntry> entries);

/// A family's module whose init_parameter() asks `source` first, and which
/// serves FSDP its parameters' parts when the source does.
template <class Module>
class SourcedModule : public Module, public ParameterRanges {
 public:
  template <class... Args>
  explicit SourcedModule(ParameterSourcePtr source, Args&&... args)
      : Module(std::forward<Args>(args)...), source_(std::move(source)) {}
  void init_parameter(const std::string& name, const torch::Tensor& param) override {
    if (!source_ || (!source_->has(name) && is_lora_parameter(name))) return Module::init_parameter(name, param);
    TORCH_CHECK(source_->has(name), "--init-from: no value for parameter ", name, " (or it was read already)");
    torch::NoGradGuard no_grad;
    if (param.is_contiguous()) return source_->read(name, 0, param.numel(), param.view({-1}));
    auto flat = torch::empty({param.numel()}, param.options());
    source_->read(name, 0, param.numel(), flat);
    param.copy_(flat.view(param.sizes()));
  }
  bool reads_ranges(const std::string& name) const override {
    return source_ && source_->serves_parts() && source_->has(name);
  }
  void read_range(const std::string& name, int64_t begin, int64_t end, const torch::Tensor& out) const override {
    source_->read(name, begin, end, out);
  }

 private:
  ParameterSourcePtr source_;
};

/// The widths every decoder has, for what reads them without knowing the
/// family (config.ini, the summary, the dry run's header).
struct ModelShape {
  int64_t layers = 0;    ///< blocks (the units strategies wrap)
  int64_t heads = 0;     ///< attention heads (0: none)
  int64_t kv_heads = 0;  ///< key/value heads (= heads without grouped queries)
  int64_t width = 0;     ///< the residual stream's
  int64_t vocab_size = 0;
  int64_t block_size = 0;
};

/// Generation over a built model: the logits of new positions, keeping what
/// it needs between calls (a KV cache).
class IncrementalDecoder {
 public:
  virtual ~IncrementalDecoder() = default;
  /// The logits [B, T, vocab] of `ids` [B, T] following everything fed so
  /// far (the prompt first, then one token at a time).
  virtual torch::Tensor feed(const torch::Tensor& ids) = 0;
};

/// The IncrementalDecoder of a model whose `forward_cached(ids, cache)` keeps
/// what it needs in a `Cache` (the Llama's and the GPT's KV caches).
template <typename Model, typename Cache>
class CachedDecoder : public IncrementalDecoder {
 public:
  explicit CachedDecoder(Model model) : model_(std::move(model)) {}
  torch::Tensor feed(const torch::Tensor& ids) override { return model_->forward_cached(ids, cache_); }

 private:
  Model model_;
  Cache cache_;
};

/// One model, resolved (a family's options with the data's vocabulary and
/// block size).
class ModelConfig {
 public:
  virtual ~ModelConfig() = default;
  /// The registered family's name (gpt, llama).
  virtual std::string family() const = 0;
  virtual ModelShape shape() const = 0;
  /// The same model with `n_layer` blocks: the activation probe's.
  virtual std::shared_ptr<const ModelConfig> with_layers(int64_t n_layer) const = 0;
  /// Its TrainingModule: eager, or `deferred` (parameters on the meta device
  /// until a strategy's setup materialises them), its init asking `source`
  /// first. The module's units are its blocks.
  virtual std::unique_ptr<TrainingModule> build(bool deferred, ParameterSourcePtr source = nullptr) const = 0;

  virtual int64_t parameters() const = 0;
  /// Those training updates (all of them, or LoRA's adapters).
  virtual int64_t trainable_parameters() const { return parameters(); }
  /// As memory models see it (parameters split into the blocks); with
  /// `tp_size` > 1 the largest tensor-parallel rank's part.
  virtual ModelSize size(int tp_size = 1) const = 0;
  /// FLOPs per token of a training step (forward + backward).
  virtual double flops_per_token() const = 0;
  /// The matrix products of one training micro-step on `tokens` positions,
  /// as autograd runs them (forward, input and weight gradients).
  virtual std::vector<GemmShape> step_gemms(int64_t tokens) const = 0;
  /// The activation formula the probe stands in for when it would be too
  /// large (per block, base, and checkpointed under `ac_policy`).
  virtual ActivationProfile activation_formula(int64_t micro_batch, Precision precision,
                                               const std::string& ac_policy) const = 0;

  /// "" when the model splits over `size` tensor-parallel ranks, else why
  /// not, naming the values. The default: a family without a tensor-parallel
  /// plan splits over no more than one rank.
  virtual std::string tensor_parallel_problem(int size, bool sequence_parallel) const;
  /// Its tensor-parallel forward's crossings per micro-batch (the default:
  /// none, for a family that does not split).
  virtual tp::Boundaries tensor_parallel_boundaries(int64_t micro_batch, int64_t sequence,
                                                    int64_t checkpoint_every) const {
    return {};
  }

  /// --init-from: the weights at `path` (a file or a directory, in the
  /// family's formats) under the module's parameter names, checked against
  /// this model (names and shapes, and a config.json beside them) and read
  /// when build()'s module asks (a family may read them here whole). Throws
  /// a one-line c10::ValueError naming `path`. The default: a family that
  /// reads no weights refuses, naming itself.
  virtual ParameterSourcePtr read_weights(const std::string& path) const;
  /// The formats write_weights writes ("pt": torch.save under the family's
  /// exchange names; "hf": a transformers directory); the first is
  /// --export-weights'. The default: none (the family writes no weights:
  /// --export-weights and strata-export refuse; checkpoints still hold them).
  virtual std::vector<std::string> weight_formats() const { return {}; }
  /// --export-weights and strata-export: `params` (the trained module's,
  /// full; LoRA adapters merged here) written to `path` in `format`, one of
  /// weight_formats().
  virtual void write_weights(const std::string& path, const NamedTensors& params, const std::string& format) const;
  /// Why `format` cannot be written at `path` ("" when it can), naming both.
  /// The default: every format is a problem (weight_formats() is empty).
  virtual std::string export_problem(const std::string& path, const std::string& format) const;
  /// The checkpoint directory whose config gave this model (--init-from a
  /// transformers directory), "" for a preset's: config.ini then records
  /// the directory, not a preset, and an "hf" export copies its tokenizer.
  virtual std::string source_directory() const { return ""; }
  /// The options source_directory()'s config gave ("n-layer": the shape),
  /// which a run must not give beside it; config.ini comments them out.
  virtual std::vector<std::string> source_keys() const { return {}; }
  /// A decoder for generation over `module` (built by this config); null:
  /// the family does not generate (strata-generate says so).
  virtual std::unique_ptr<IncrementalDecoder> decoder(TrainingModule& module) const {
    (void)module;
    return nullptr;
  }
  /// True when the positions are parameters (GPT's wpe): the model then reads
  /// no more than its block size, and generation stays within it; false when
  /// they are computed (RoPE), so a longer block needs no other weights.
  virtual bool positions_learned() const { return false; }
  /// Options config.ini records, resolved ("n-layer", "dropout"): key ->
  /// value, under the keys the family declares.
  virtual std::map<std::string, double> resolved_numbers() const { return {}; }
  /// The same for options given as text ("attention"): a family whose
  /// default differs from strata-gpt's records its own.
  virtual std::map<std::string, std::string> resolved_texts() const { return {}; }
};

using ModelPtr = std::shared_ptr<const ModelConfig>;

/// What a run asks a family for: a preset, the options given for it (its
/// declared keys, as text: "n-layer" -> "6", "attention" -> "sdpa"; the
/// factory sees only those given away from their declared defaults) and the
/// data's vocabulary and sequence length.
struct ModelRequest {
  /// "": not given (an --init-from directory a family recognizes names the model).
  std::string preset;
  /// The preset when neither `preset` nor such a directory names the model.
  std::string default_preset;
  std::map<std::string, std::string> options;
  /// --init-from's path ("": none): a family may take the model from it (a
  /// transformers directory's config.json).
  std::string init_from;
  /// --init-adapter's path ("": none): a PEFT adapter directory for the
  /// --init-from model, read by a family whose spec reads_adapters.
  std::string init_adapter;
  int64_t vocab_size = 0;
  int64_t block_size = 0;

  bool has(const std::string& key) const { return options.count(key) != 0; }
  /// The option as a number or a bool, `fallback` when not given; a
  /// one-line c10::ValueError naming the key and text when it does not parse.
  int64_t integer(const std::string& key, int64_t fallback) const;
  double real(const std::string& key, double fallback) const;
  bool boolean(const std::string& key, bool fallback) const;
  std::string text(const std::string& key, const std::string& fallback) const;
};

class ModelSpec {
 public:
  using Factory = std::function<ModelPtr(const ModelRequest& request)>;
  using Recognize = std::function<bool(const std::string& path)>;

  ModelSpec(std::string name, std::string description)
      : name_(std::move(name)), description_(std::move(description)) {}

  /// The family's name (ModelConfig::family), in --help and errors.
  TORCH_ARG(std::string, name);
  TORCH_ARG(std::string, description);
  /// --preset's values for this family; each names one family only.
  TORCH_ARG(std::vector<std::string>, presets) = {};
  /// strata-gpt's --preset when none is given, when this family is the
  /// first registered to name one ("": none).
  TORCH_ARG(std::string, default_preset) = "";
  /// The options the family reads (n-layer, attention, ...), typed, with
  /// their help and rules: strata-gpt's command line, --config and
  /// config.ini gain each key (one key may be declared by several families,
  /// with one kind). A run given a key its family does not declare, or a
  /// value against the declaration's rule, is refused naming both.
  TORCH_ARG(std::vector<ModelOption>, options) = {};
  TORCH_ARG(Factory, factory) = nullptr;
  /// Whether --init-from's `path` is a checkpoint directory of this family
  /// that describes its model (then no --preset is needed); null: none is.
  TORCH_ARG(Recognize, recognizes) = nullptr;
  /// Whether its factory takes ModelRequest::init_adapter (PEFT adapters).
  TORCH_ARG(bool, reads_adapters) = false;
  /// What strata-bench's suites run the family on (bench_workloads.h);
  /// empty: the family has no bench rows but --sweep's.
  TORCH_ARG(BenchWorkloads, bench) = {};
};

/// The registered ModelSpecs, by family and by preset.
class ModelRegistry {
 public:
  /// Errors (naming them) for a family already registered, a spec without a
  /// factory or presets, a preset another family has, or an option key
  /// another family declares with another kind.
  void add(ModelSpec spec);
  /// The family of `preset`; throws c10::ValueError "unknown preset 'x';
  /// available: ..." when none has it.
  const ModelSpec& spec_of_preset(const std::string& preset) const;
  /// The model a request resolves to: the family of its --init-from
  /// directory when one recognizes it (a --preset of another family is then
  /// refused), else of its preset; its factory, after refusing a given key
  /// the family does not read.
  ModelPtr resolve(const ModelRequest& request) const;
  /// The family that recognizes `path` as a directory describing its model, or null.
  const ModelSpec* recognizing(const std::string& path) const;
  /// Every preset, family by family in registration order.
  std::vector<std::string> preset_names() const;
  /// The families whose spec reads_adapters, for errors.
  std::vector<std::string> adapter_families() const;
  /// The first family's default_preset that one names, else the first preset.
  std::string default_preset() const;
  std::vector<const ModelSpec*> specs() const;
  /// The first family whose bench workloads name a medium preset: the one the
  /// strategy suites run. Throws c10::ValueError when none does.
  const ModelSpec& bench_family() const;

 private:
  std::deque<ModelSpec> specs_;
  std::map<std::string, size_t> presets_;  ///< preset -> specs_ index
};

/// The matrix products of one training micro-step through `linears` (in,
/// out, how many of them) on `tokens` positions: per Linear forward [t, in] x
/// [in, out], input gradient [t, out] x [out, in], weight gradient [out, t] x
/// [t, in]; one entry per shape with how many a step runs.
std::vector<GemmShape> linear_step_gemms(const std::vector<std::tuple<int64_t, int64_t, int64_t>>& linears,
                                         int64_t tokens);

/// The options every decoder family here declares alike: n-layer, n-head,
/// n-embd (0: the preset's), and attention (fused, sdpa or naive).
std::vector<ModelOption> decoder_options();
/// LoRA's options (models/lora.h): lora-rank (0: off), lora-alpha, and
/// lora-targets, whose help is the family's (`targets_help`: its names and
/// default).
std::vector<ModelOption> lora_options(const std::string& targets_help);

/// The built-in families, each from its own folder: gpt (models/gpt), llama
/// (models/llama).
void register_builtin_models(ModelRegistry& registry);

}  // namespace strata::recipes
