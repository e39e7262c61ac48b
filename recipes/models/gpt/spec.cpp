#include "strata/recipes/models/gpt/spec.h"

#include "strata/recipes/models/gpt/hf_gpt2.h"
#include "strata/recipes/models/gpt/interop.h"
#include "strata/recipes/models/lora.h"

#include <map>
#include <tuple>

namespace strata::recipes {
namespace {

// The activation formula's constants, fitted to the probe on
// gpt-nano/micro/mini (fp32, fused attention, no dropout): a block keeps
// ~kBlockFloats x B·T·C floats for backward (ln outputs, qkv and its head
// copies, attention output and logsumexp, the MLP's 4C input/GELU/output,
// residuals); the head keeps the logits, their log-softmax and, in
// backward, their gradient (~kLogitFloats x B·T·V) plus embeddings and ln_f
// (~kBaseEmbdFloats x B·T·C).
constexpr double kBlockFloats = 16.0;
constexpr double kLogitFloats = 3.0;
constexpr double kBaseEmbdFloats = 4.0;

/// Parameters of one block (all blocks have the same shape).
int64_t gpt_block_parameters(const GPTOptions& model) {
  auto one = model;
  auto two = model;
  return count_parameters(two.n_layer(2)) - count_parameters(one.n_layer(1));
}

}  // namespace

GPTConfig::GPTConfig(GPTOptions options) : options_(std::move(options)) { validate(options_); }

ModelShape GPTConfig::shape() const {
  const auto& o = options_;
  return {o.n_layer(), o.n_head(), o.n_head(), o.n_embd(), o.vocab_size(), o.block_size()};
}

ModelPtr GPTConfig::with_layers(int64_t n_layer) const {
  auto o = options_;
  return std::make_shared<GPTConfig>(o.n_layer(n_layer));
}

std::unique_ptr<TrainingModule> GPTConfig::build(bool deferred, ParameterSourcePtr source) const {
  if (!source) return std::make_unique<GPTModule>(options_, deferred);
  return std::make_unique<SourcedModule<GPTModule>>(std::move(source), options_, deferred);
}

ModelSize GPTConfig::size(int tp_size) const {
  const auto& model = options_;
  ModelSize m;
  m.units = model.n_layer();
  if (tp_size > 1) {
    // The largest tensor-parallel part; under LoRA its adapters train.
    const int64_t lora = count_lora_parameters(model, tp_size);
    m.params = count_tensor_parallel_parameters(model, tp_size);
    m.trainable = lora > 0 ? lora : m.params;
    m.unit_params = count_tensor_parallel_block_parameters(model, tp_size) + lora / model.n_layer();
    m.unit_trainable = lora > 0 ? lora / model.n_layer() : m.unit_params;
    return m;
  }
  m.params = count_parameters(model);
  m.trainable = count_trainable_parameters(model);
  m.unit_params = gpt_block_parameters(model);
  // LoRA: a block's trainable parameters are its adapters (the root has none).
  m.unit_trainable = model.lora_rank() > 0 ? count_lora_parameters(model) / model.n_layer() : m.unit_params;
  return m;
}

std::vector<GemmShape> GPTConfig::step_gemms(int64_t tokens) const {
  const int64_t c = options_.n_embd(), l = options_.n_layer();
  // (in, out, how many) of every Linear a step runs; the head: the tied
  // embedding's [V, C] as a Linear [C -> V].
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> linears = {
      {c, 3 * c, l}, {c, c, l}, {c, 4 * c, l}, {4 * c, c, l}, {c, options_.vocab_size(), 1}};
  return linear_step_gemms(linears, tokens);
}

ActivationProfile GPTConfig::activation_formula(int64_t micro_batch, Precision precision,
                                                const std::string& ac_policy) const {
  const auto& model = options_;
  const double bt = double(micro_batch) * double(model.block_size());
  const double c = double(model.n_embd()), v = double(model.vocab_size());
  const double half = compute_dtype(precision) ? 0.5 : 1.0;  // bf16 and fp16: 2 bytes
  double block = kBlockFloats * bt * c * 4.0 * half;
  if (model.attention() == "naive") {
    block += 3.0 * double(micro_batch) * double(model.n_head()) * double(model.block_size()) *
             double(model.block_size()) * 4.0 * half;
  }
  ActivationProfile a;
  a.per_block = static_cast<int64_t>(block);
  a.base = static_cast<int64_t>(kLogitFloats * bt * v * 4.0 + kBaseEmbdFloats * bt * c * 4.0);
  // Checkpointed: each block keeps its input; the peak is the head's or one
  // block recomputed plus its backward (~2 blocks' activations), the larger.
  // Selective policies keep, in the compute dtype: attention's output (and
  // under bf16 its fp32 copy, 2 half-words) plus, under "op", the c_attn and
  // c_fc outputs (3C + 4C).
  double kept = 0.0;
  if (ac_policy != "full") kept += (1.0 + (half < 1.0 ? 2.0 : 0.0)) * half;
  if (ac_policy == "op") kept += 7.0 * half;
  a.checkpointed_per_block = static_cast<int64_t>(bt * c * 4.0 * (1.0 + kept));
  a.checkpointed_base = std::max(a.base, 2 * a.per_block);
  a.measured = false;
  return a;
}

std::string GPTConfig::tensor_parallel_problem(int size, bool sequence_parallel) const {
  return recipes::tensor_parallel_problem(options_, size, sequence_parallel);
}

tp::Boundaries GPTConfig::tensor_parallel_boundaries(int64_t micro_batch, int64_t sequence,
                                                     int64_t checkpoint_every) const {
  return recipes::tensor_parallel_boundaries(options_, micro_batch, sequence, checkpoint_every);
}

ParameterSourcePtr GPTConfig::read_weights(const std::string& path) const {
  GPTModule shape_only(options_, /*deferred=*/true);  // names and shapes, no memory
  // Shapes cannot tell a head count apart: a transformers config.json can.
  const std::string mismatch = hf_config_mismatch(path, options_);
  TORCH_CHECK_VALUE(mismatch.empty(), "--init-from '", path, "': its config.json does not describe this model (",
                    mismatch, ")");
  // Read whole: torch.save and nanoGPT files are pickles, read in one piece.
  return weights_in_memory(from_nanogpt(recipes::read_weights(path), shape_only.module(), options_, path));
}

std::vector<std::string> GPTConfig::weight_formats() const { return {"pt", "hf"}; }

void GPTConfig::write_weights(const std::string& path, const NamedTensors& params, const std::string& format) const {
  const std::string problem = export_problem(path, format);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  // LoRA: the adapters merged into their Linears, so the file is a plain GPT.
  if (format == "hf") {
    write_hf_gpt2(path, merge_lora(params, options_.lora_rank(), options_.lora_alpha()), options_);
  } else {
    recipes::write_weights(path, merge_lora(params, options_.lora_rank(), options_.lora_alpha()), options_);
  }
}

std::string GPTConfig::export_problem(const std::string& path, const std::string& format) const {
  if (format == "hf") {
    if (options_.bias()) return "";
    return "a transformers GPT-2 has Linear and LayerNorm biases, but this GPT was built with --bias false; write "
           "format pt for '" + path + "'";
  }
  if (format != "pt") return "unknown weights format '" + format + "' for a gpt model; allowed: pt, hf";
  // The file is torch.save's: under a .safetensors name --init-from would
  // read it as safetensors and refuse it.
  if (!path.ends_with(".safetensors")) return "";
  return "--export-weights '" + path +
         "' names a safetensors file, but it writes torch.save's format (nanoGPT's names); give a .pt name, or "
         "write safetensors with strata-export --format hf CHECKPOINT DIR";
}

std::unique_ptr<IncrementalDecoder> GPTConfig::decoder(TrainingModule& module) const {
  auto* gpt = dynamic_cast<GPTModule*>(&module);
  TORCH_CHECK(gpt != nullptr, "GPTConfig::decoder: the module is not a GPT");
  return std::make_unique<CachedDecoder<GPT, GPTKVCache>>(gpt->model());
}

std::map<std::string, double> GPTConfig::resolved_numbers() const {
  const auto& o = options_;
  return {{"n-layer", double(o.n_layer())}, {"n-head", double(o.n_head())}, {"n-embd", double(o.n_embd())},
          {"dropout", o.dropout()},         {"init-std", init_std_of(o)}};
}

std::map<std::string, std::string> GPTConfig::resolved_texts() const {
  if (options_.lora_rank() == 0) return {};
  return {{"lora-targets", options_.lora_targets()}};
}

ModelPtr gpt_model(const GPTOptions& options) { return std::make_shared<GPTConfig>(options); }

namespace {

/// The decoder's options, then the GPT's own, then LoRA's.
std::vector<ModelOption> gpt_options() {
  auto options = decoder_options();
  options.push_back(ModelOption::real("dropout", -1.0, "dropout probability (-1: the preset's)").at_least(-1.0).below(1.0));
  options.push_back(ModelOption::boolean("bias", true, "biases in Linear layers (nanoGPT's default: true)"));
  options.push_back(ModelOption::choice("activation", "gelu", {"gelu", "gelu_new"},
                                        "the MLP's GELU: gelu (exact, nanoGPT's) or gelu_new (the tanh "
                                        "approximation of OpenAI's GPT-2 and transformers' gelu_new)"));
  options.push_back(ModelOption::real("init-std", 0.0,
                                      "the weight matrices' init std (c_proj's over sqrt(2 n_layer)); 0: GPT-2's "
                                      "0.02 scaled to the width, 0.02 sqrt(768 / n_embd) below 768 wide; 0.02: "
                                      "nanoGPT's at every width")
                        .at_least(0.0)
                        .below(1.0));
  for (auto& o : lora_options("LoRA's Linears: attn (attn.c_attn, attn.c_proj; default), mlp (c_fc, c_proj) or attn,mlp")) {
    options.push_back(std::move(o));
  }
  return options;
}

}  // namespace

namespace {

/// strata-bench's workloads on the GPT: every strategy suite's (the
/// baselines in bench/baselines/ name these cases), the planner's fitted and
/// held-out cases, and the peer jobs against nanoGPT's model (gpt_peer.py).
BenchWorkloads gpt_bench() {
  BenchWorkloads b;
  b.tiny = {"gpt-nano", 8, 20};
  b.small = {"gpt-micro", 16, 60};
  b.medium = {"gpt-mini", 8, 40};
  b.wide_flags = {"--n-embd", "384"};
  b.wide_tag = "384";
  // gpt2-large/xl (774M/1.5B parameters: 12/24 GB of fp32 AdamW state per
  // unsharded rank) are left out: on a shared machine an OOM there hurts others.
  b.scale = {"gpt-nano", "gpt-micro", "gpt-mini", "gpt2", "gpt2-medium"};
  b.planner = {"gpt-nano", "gpt-micro", "gpt-mini"};
  b.planner_held_out = {
      {"gpt-micro", 0, 2, 128, 8, {"--n-embd", "192"}, "w192"},
      {"gpt-micro", 3, 2, 128, 8, {"--n-embd", "192"}, "w192"},
      {"gpt-mini", 2, 2, 64, 16},
      {"gpt-mini", 3, 2, 256, 4},
      {"gpt-mini", 1, 3, 128, 8},
      {"gpt-mini", 3, 4, 128, 4},  // fsdp where N does not divide evenly: padding
      {"gpt-nano", 4, 3, 256, 4},
      {"gpt-micro", 0, 4, 64, 8},
  };
  b.checkpoint = {"gpt-mini", "gpt2"};
  b.peer = {.preset = "gpt-mini", .init_format = "pt", .op_sac = true, .wide = true};
  return b;
}

}  // namespace

ModelSpec gpt_model_spec() {
  ModelSpec spec("gpt", "nanoGPT's GPT-2: learned positions, LayerNorm, GELU MLP, multi-head attention");
  spec.presets(gpt_preset_names())
      .default_preset("gpt-micro")  // strata-gpt's first run: seconds per step on 2 cores
      .options(gpt_options())
      .bench(gpt_bench())
      .factory([](const ModelRequest& r) -> ModelPtr {
        GPTOptions o = gpt_preset(r.preset);
        o.n_layer(r.integer("n-layer", o.n_layer())).n_head(r.integer("n-head", o.n_head()));
        o.n_embd(r.integer("n-embd", o.n_embd()));
        if (const double p = r.real("dropout", -1.0); p >= 0) o.dropout(p);  // < 0: the preset's
        o.bias(r.boolean("bias", o.bias())).attention(r.text("attention", o.attention()));
        o.activation(r.text("activation", o.activation())).init_std(r.real("init-std", o.init_std()));
        o.lora_rank(r.integer("lora-rank", o.lora_rank())).lora_alpha(r.real("lora-alpha", o.lora_alpha()));
        o.lora_targets(r.text("lora-targets", o.lora_targets()));
        o.vocab_size(r.vocab_size).block_size(r.block_size);
        return gpt_model(o);
      });
  return spec;
}

}  // namespace strata::recipes
