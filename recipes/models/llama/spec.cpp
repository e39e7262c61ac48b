#include "strata/recipes/models/llama/spec.h"

#include "strata/recipes/io/safetensors.h"
#include "strata/recipes/models/llama/hf_checkpoint.h"
#include "strata/recipes/models/llama/peft.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

namespace strata::recipes {
namespace {

/// The keys a transformers directory's config.json gives: the shape.
const std::vector<std::string> kShapeKeys = {"n-layer", "n-head", "n-embd"};

// The formula's base, as the GPT's: logits, their log-softmax and gradient
// (~3 x B·T·V) plus the embedding's output and the final norm (~4 x B·T·C).
constexpr double kLlamaLogitFloats = 3.0;
constexpr double kLlamaBaseEmbdFloats = 4.0;

/// Parameters of one block on the largest of `size` tensor-parallel ranks.
int64_t llama_block_parameters(const LlamaOptions& o, int size) {
  const int64_t c = o.n_embd(), d = o.head_size(), q = o.n_head() * d, kv = o.kv_heads() * d;
  const int64_t f = o.intermediate_size(), s = size;
  const int64_t split = (c * q + 2 * c * kv + q * c + (o.qkv_bias() ? q + 2 * kv : 0) + 3 * c * f +
                         (o.mlp_bias() ? 2 * f : 0)) / s;
  const int64_t whole = 2 * c + (o.o_bias() ? c : 0) + (o.mlp_bias() ? c : 0) + (o.qk_norm() ? 2 * d : 0);
  return split + whole;
}

}  // namespace

LlamaConfig::LlamaConfig(LlamaOptions options, std::string source, std::string adapter)
    : options_(std::move(options)), source_(std::move(source)), adapter_(std::move(adapter)) {
  validate(options_);
}

ModelShape LlamaConfig::shape() const {
  const auto& o = options_;
  return {o.n_layer(), o.n_head(), o.kv_heads(), o.n_embd(), o.vocab_size(), o.block_size()};
}

ModelPtr LlamaConfig::with_layers(int64_t n_layer) const {
  auto o = options_;
  return std::make_shared<LlamaConfig>(o.n_layer(n_layer));
}

std::unique_ptr<TrainingModule> LlamaConfig::build(bool deferred, ParameterSourcePtr source) const {
  if (!source) return std::make_unique<LlamaModule>(options_, deferred);
  return std::make_unique<SourcedModule<LlamaModule>>(std::move(source), options_, deferred);
}

int64_t LlamaConfig::trainable_parameters() const {
  return options_.lora_rank() > 0 ? count_llama_lora_parameters(options_) : parameters();
}

ModelSize LlamaConfig::size(int tp_size) const {
  const auto& o = options_;
  const int size = std::max(1, tp_size);
  ModelSize m;
  m.units = o.n_layer();
  m.unit_params = llama_block_parameters(o, size);
  // The vocabulary's uneven split rounds up; the final norm is whole.
  const int64_t rows = ceil_div(o.vocab_size(), size);
  const int64_t root = rows * o.n_embd() * (o.tie_weights() ? 1 : 2) + o.n_embd();
  // LoRA: a block's trainable parameters are its adapters (the root has none).
  const int64_t lora = count_llama_lora_parameters(o, size);
  m.unit_params += lora / o.n_layer();
  m.params = size == 1 ? count_parameters(o) : root + m.units * m.unit_params;
  m.trainable = lora > 0 ? lora : m.params;
  m.unit_trainable = lora > 0 ? lora / o.n_layer() : m.unit_params;
  return m;
}

std::vector<GemmShape> LlamaConfig::step_gemms(int64_t tokens) const {
  const auto& o = options_;
  const int64_t c = o.n_embd(), q = o.n_head() * o.head_size(), kv = o.kv_heads() * o.head_size();
  const int64_t f = o.intermediate_size(), l = o.n_layer();
  return linear_step_gemms({{c, q, l}, {c, kv, 2 * l}, {q, c, l}, {c, f, 2 * l}, {f, c, l}, {c, o.vocab_size(), 1}},
                           tokens);
}

ActivationProfile LlamaConfig::activation_formula(int64_t micro_batch, Precision precision,
                                                  const std::string& ac_policy) const {
  const auto& o = options_;
  const double bt = double(micro_batch) * double(o.block_size());
  const double c = double(o.n_embd()), v = double(o.vocab_size()), d = double(o.head_size());
  const double q = double(o.n_head()) * d, kv = double(o.kv_heads()) * d, f = double(o.intermediate_size());
  const double half = compute_dtype(precision) ? 0.5 : 1.0;
  double block = (6.0 * c + 3.0 * q + 3.0 * kv + 4.0 * f) * bt * 4.0 * half;
  if (o.attention() == "naive") {
    block += 3.0 * double(micro_batch) * double(o.n_head()) * double(o.block_size()) * double(o.block_size()) *
             4.0 * half;
  }
  ActivationProfile a;
  a.per_block = static_cast<int64_t>(block);
  a.base = static_cast<int64_t>(kLlamaLogitFloats * bt * v * 4.0 + kLlamaBaseEmbdFloats * bt * c * 4.0);
  // Checkpointed: each block keeps its input (and under a selective policy
  // what it saves: the attention output, under "op" q/k/v and gate/up too).
  double kept = 0.0;
  if (ac_policy != "full") kept += q / c * half;
  if (ac_policy == "op") kept += (q + 2.0 * kv + 2.0 * f) / c * half;
  a.checkpointed_per_block = static_cast<int64_t>(bt * c * 4.0 * (1.0 + kept));
  a.checkpointed_base = std::max(a.base, 2 * a.per_block);
  return a;
}

std::string LlamaConfig::tensor_parallel_problem(int size, bool sequence_parallel) const {
  return recipes::tensor_parallel_problem(options_, size, sequence_parallel);
}

tp::Boundaries LlamaConfig::tensor_parallel_boundaries(int64_t micro_batch, int64_t sequence,
                                                       int64_t checkpoint_every) const {
  tp::Boundaries b;
  const int64_t layers = options_.n_layer();
  b.activation = micro_batch * sequence * options_.n_embd();
  b.forward_sums = 2 * layers + 1;   // o_proj, down_proj per block; the embedding
  b.fp32_forward_sums = 1;           // the embedding's lookup
  b.backward_sums = 2 * layers + 1;  // q/k/v's and gate/up's inputs per block; the head's
  b.recomputed_sums = checkpoint_every > 0 ? 2 * ((layers + checkpoint_every - 1) / checkpoint_every) : 0;
  b.loss_positions = micro_batch * sequence;
  // Replicated parameters whose gradient sequence parallelism sums: the norms.
  b.sequence_parallel_params = (2 * layers + 1) * options_.n_embd();
  if (options_.lora_rank() == 0) return b;
  // LoRA: the base is frozen, so nothing before the first adapter needs a
  // gradient: the embedding's sum, block 0's q/k/v input (its norm and the
  // embedding are frozen), and without attention adapters block 0's o_proj
  // sum and gate/up input, without any before it its down_proj sum.
  const auto t = parse_llama_lora_targets(options_.lora_targets());
  const bool qkv = t.q || t.k || t.v;
  b.forward_sums_without_gradient = 1 + (qkv ? 0 : 1) + (t.attention() || t.gate || t.up ? 0 : 1);
  b.backward_sums_without_gradient = 1 + (t.attention() ? 0 : 1);
  // Narrow crossings: a column adapter's r features backward (its A product
  // is whole), a row adapter's forward.
  b.adapter_activation = micro_batch * sequence * options_.lora_rank();
  b.adapter_forward_sums = layers * t.row_count();
  b.adapter_backward_sums = layers * t.column_count();
  const int64_t recomputed = checkpoint_every > 0 ? (layers + checkpoint_every - 1) / checkpoint_every : 0;
  b.adapter_recomputed_sums = t.row_count() * recomputed;
  b.adapter_recomputed_gathers = t.column_count() * recomputed;
  // Only adapters train: the summed replicated gradients are the column
  // adapters' A [r, C] and the row adapters' B [C, r].
  b.sequence_parallel_params = layers * (t.column_count() + t.row_count()) * options_.lora_rank() * options_.n_embd();
  return b;
}

ParameterSourcePtr LlamaConfig::read_weights(const std::string& path) const {
  TORCH_CHECK_VALUE(is_hf_llama_dir(path), "--init-from '", path,
                    "': not a transformers directory of a Llama-family model (config.json with model_type llama, "
                    "mistral, qwen2 or qwen3, and its safetensors)");
  // The headers only: each rank reads its parts of the tensors when its
  // strategy's setup asks (under FSDP only the bytes of its shards).
  auto entries = read_hf_entries(path);
  LlamaModule shape_only(options_, /*deferred=*/true);  // names and shapes, no memory
  std::map<std::string, SafetensorsEntry> out;
  // Adapters start from LoRA's init, or from the adapter directory's weights.
  auto adapters = adapter_.empty() ? std::map<std::string, SafetensorsEntry>{} : read_peft_lora(adapter_).weights;
  for (auto& item : shape_only.module().named_parameters()) {
    if (is_lora_parameter(item.key())) {
      if (adapter_.empty()) continue;
      const auto it = adapters.find(item.key());
      TORCH_CHECK_VALUE(it != adapters.end(), "adapter '", adapter_, "': lacks the adapter of '", item.key(), "' ",
                        item.value().sizes());
      TORCH_CHECK_VALUE(it->second.shape == item.value().sizes().vec(), "adapter '", adapter_, "': '", item.key(),
                        "' has shape ", c10::IntArrayRef(it->second.shape), ", the model ", item.value().sizes());
      out[item.key()] = it->second;
      adapters.erase(it);
      continue;
    }
    const auto it = entries.find(item.key());
    TORCH_CHECK_VALUE(it != entries.end(), "--init-from '", path, "': lacks '", item.key(), "' ", item.value().sizes());
    TORCH_CHECK_VALUE(it->second.shape == item.value().sizes().vec(), "--init-from '", path, "': '", item.key(),
                      "' has shape ", c10::IntArrayRef(it->second.shape), ", the model ", item.value().sizes());
    TORCH_CHECK_VALUE(at::isFloatingType(it->second.dtype), "--init-from '", path, "': '", item.key(), "' is ",
                      it->second.dtype, "; weights are floating point (F32, F16, BF16)");
    out[item.key()] = it->second;
  }
  for (const auto& [name, entry] : entries) {
    if (out.count(name) || (options_.tie_weights() && name == "lm_head.weight") ||
        name.find("rotary_emb.inv_freq") != std::string::npos) {
      continue;
    }
    TORCH_CHECK_VALUE(false, "--init-from '", path, "': holds '", name, "', which this ", options_.model_type(),
                      " model has not");
  }
  TORCH_CHECK_VALUE(adapters.empty(), "adapter '", adapter_, "': holds an adapter for '",
                    adapters.empty() ? "" : adapters.begin()->first, "', which this ", options_.model_type(),
                    " model has not");
  return safetensors_parameters(std::move(out));
}

namespace {

/// The files transformers' tokenizers and generation read beside the weights.
constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                                           "special_tokens_map.json", "added_tokens.json", "vocab.json",
                                           "merges.txt", "chat_template.jinja", "generation_config.json"};

}  // namespace

void LlamaConfig::write_weights(const std::string& path, const NamedTensors& params, const std::string& format) const {
  const std::string problem = export_problem(path, format);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  if (format == "peft") return write_peft_lora(path, params, options_, source_);
  // LoRA: the adapters merged into their projections, so the directory is a plain model.
  write_hf_llama(path, merge_lora(params, options_.lora_rank(), options_.lora_alpha()), options_);
  if (source_.empty()) return;
  namespace fs = std::filesystem;
  for (const char* name : kTokenizerFiles) {
    const fs::path from = fs::path(source_) / name;
    std::error_code ec;
    if (!fs::is_regular_file(from, ec) || fs::equivalent(from, fs::path(path) / name, ec)) continue;
    fs::copy_file(from, fs::path(path) / name, fs::copy_options::overwrite_existing);
  }
}

std::string LlamaConfig::export_problem(const std::string& path, const std::string& format) const {
  if (format != "hf" && format != "peft") {
    return "unknown weights format '" + format + "' for a llama model; allowed: hf, peft";
  }
  if (format == "peft" && options_.lora_rank() == 0) {
    return "format peft writes LoRA adapters, and this model has none (--lora-rank 0); use --format hf";
  }
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_directory(path, ec)) {
    return "--export-weights '" + path + "' is a file, but a " + options_.model_type() +
           " model is written as a transformers directory (config.json, model.safetensors); give a directory";
  }
  return "";
}

std::unique_ptr<IncrementalDecoder> LlamaConfig::decoder(TrainingModule& module) const {
  auto* llama = dynamic_cast<LlamaModule*>(&module);
  TORCH_CHECK(llama != nullptr, "LlamaConfig::decoder: the module is not a Llama");
  return std::make_unique<CachedDecoder<Llama, KVCache>>(llama->model());
}

std::vector<std::string> LlamaConfig::source_keys() const {
  return source_.empty() ? std::vector<std::string>{} : kShapeKeys;
}

std::map<std::string, double> LlamaConfig::resolved_numbers() const {
  const auto& o = options_;
  return {{"n-layer", double(o.n_layer())}, {"n-head", double(o.n_head())}, {"n-embd", double(o.n_embd())}};
}

std::map<std::string, std::string> LlamaConfig::resolved_texts() const {
  std::map<std::string, std::string> texts{{"attention", options_.attention()}};
  if (options_.lora_rank() > 0) texts["lora-targets"] = options_.lora_targets();
  return texts;
}

ModelPtr llama_model(const LlamaOptions& options, const std::string& source, const std::string& adapter) {
  return std::make_shared<LlamaConfig>(options, source, adapter);
}

namespace {

/// LoRA's keys, when given, on `o`.
void with_lora(LlamaOptions& o, const ModelRequest& r) {
  o.lora_rank(r.integer("lora-rank", o.lora_rank())).lora_alpha(r.real("lora-alpha", o.lora_alpha()));
  o.lora_targets(r.text("lora-targets", o.lora_targets()));
}

/// LoRA's options from --init-adapter's adapter_config.json; a LoRA key
/// given as well must say the same.
void with_adapter_lora(LlamaOptions& o, const ModelRequest& r) {
  const PeftLora a = read_peft_lora(r.init_adapter);
  const auto differs = [&](const char* key, const std::string& given, const std::string& adapter) {
    TORCH_CHECK_VALUE(false, "--", key, " ", given, " differs from --init-adapter '", r.init_adapter, "': its ",
                      adapter, "; drop --", key, " (the adapter's config gives it)");
  };
  if (r.has("lora-rank") && r.integer("lora-rank", 0) != a.rank) {
    differs("lora-rank", r.text("lora-rank", ""), "r " + std::to_string(a.rank));
  }
  if (r.has("lora-alpha") && r.real("lora-alpha", 0) != a.alpha) {
    differs("lora-alpha", r.text("lora-alpha", ""), "lora_alpha " + c10::str(a.alpha));
  }
  const auto same = [](const LlamaLoraTargets& x, const LlamaLoraTargets& y) {
    return x.q == y.q && x.k == y.k && x.v == y.v && x.o == y.o && x.gate == y.gate && x.up == y.up && x.down == y.down;
  };
  if (r.has("lora-targets") &&
      !same(parse_llama_lora_targets(r.text("lora-targets", "")), parse_llama_lora_targets(a.targets))) {
    differs("lora-targets", r.text("lora-targets", ""), "target_modules " + a.targets);
  }
  o.lora_rank(a.rank).lora_alpha(a.alpha).lora_targets(a.targets);
}

/// The model of an --init-from directory: its config, the data's block size.
ModelPtr llama_from_directory(const ModelRequest& r) {
  for (const std::string& key : kShapeKeys) {
    TORCH_CHECK_VALUE(!r.has(key), "--", key, " ", r.text(key, ""), " does not apply with --init-from '", r.init_from,
                      "': its config.json gives the model's shape");
  }
  LlamaOptions o = read_hf_llama_options(r.init_from);
  TORCH_CHECK_VALUE(r.vocab_size <= o.vocab_size(), "--init-from '", r.init_from, "': its vocabulary of ",
                    o.vocab_size(), " tokens is smaller than the data's ", r.vocab_size);
  TORCH_CHECK_VALUE(r.block_size <= o.max_position_embeddings(), "--init-from '", r.init_from,
                    "': block size ", r.block_size, " exceeds its max_position_embeddings ",
                    o.max_position_embeddings());
  o.block_size(r.block_size).attention(r.text("attention", o.attention()));
  if (r.init_adapter.empty()) {
    with_lora(o, r);
  } else {
    with_adapter_lora(o, r);
  }
  const auto absolute = [](const std::string& p) { return std::filesystem::absolute(p).lexically_normal().string(); };
  return llama_model(o, absolute(r.init_from), r.init_adapter.empty() ? "" : absolute(r.init_adapter));
}

}  // namespace

namespace {

std::vector<ModelOption> llama_options() {
  auto options = decoder_options();
  for (auto& o : lora_options("LoRA's Linears: q, k, v, o, gate, up, down (or PEFT's q_proj ... down_proj), comma-separated, or "
                              "all (default q,v: PEFT's)")) {
    options.push_back(std::move(o));
  }
  return options;
}

}  // namespace

namespace {

/// strata-bench's workloads on the Llama: planner cases held out from the
/// constants' fit (RMSNorm, SwiGLU, RoPE and grouped queries, which the
/// constants never saw; the activations are its own probe's), and the peer
/// jobs against transformers' own LlamaForCausalLM (bench/peers/llama_peer.py):
/// what its users run (single, DDP, FSDP2) and lit-gpt's recipe, FSDP with
/// every decoder layer checkpointed.
BenchWorkloads llama_bench() {
  BenchWorkloads b;
  b.planner_held_out = {
      {"llama-mini", 0, 2, 128, 8},
      {"llama-mini", 3, 2, 128, 8},
      {"llama-micro", 2, 3, 128, 8},
      {"llama-mini", 4, 2, 256, 4},
  };
  b.peer = {.preset = "llama-mini",
            .init_format = "hf",
            .modes = {"local", "DistributedDataParallel", "fully_shard"},
            .ac_modes = {"fully_shard"}};
  return b;
}

}  // namespace

ModelSpec llama_model_spec() {
  ModelSpec spec("llama", "the Llama family (Llama 2/3, Mistral, Qwen2/2.5/3, SmolLM2, TinyLlama): RoPE, "
                          "RMSNorm, SwiGLU, grouped-query attention");
  spec.presets(llama_preset_names())
      .options(llama_options())
      .bench(llama_bench())
      .recognizes([](const std::string& path) { return is_hf_llama_dir(path); })
      .reads_adapters(true)
      .factory([](const ModelRequest& r) -> ModelPtr {
        if (r.preset.empty()) return llama_from_directory(r);
        LlamaOptions o = llama_preset(r.preset);
        o.n_layer(r.integer("n-layer", o.n_layer())).n_head(r.integer("n-head", o.n_head()));
        o.n_embd(r.integer("n-embd", o.n_embd())).attention(r.text("attention", o.attention()));
        with_lora(o, r);
        o.vocab_size(r.vocab_size).block_size(r.block_size);
        o.max_position_embeddings(std::max(o.max_position_embeddings(), r.block_size));
        return llama_model(o);
      });
  return spec;
}

}  // namespace strata::recipes
