#include "strata/recipes/models/gpt/gpt.h"

#include "strata/core/deferred_init.h"
#include "strata/kernels/attention.h"
#include "strata/strategies/activation_checkpoint.h"
#include "strata/strategies/tp/mesh.h"

#include <c10/util/StringUtil.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace strata::recipes {

namespace {
const std::vector<std::pair<std::string, std::array<int64_t, 3>>>& presets() {
  // minGPT's small configurations and the GPT-2 family (layers, heads, width).
  static const std::vector<std::pair<std::string, std::array<int64_t, 3>>> table = {
      {"gpt-nano", {3, 3, 48}},       {"gpt-micro", {4, 4, 128}},
      {"gpt-mini", {6, 6, 192}},      {"gpt2", {12, 12, 768}},
      {"gpt2-medium", {24, 16, 1024}}, {"gpt2-large", {36, 20, 1280}},
      {"gpt2-xl", {48, 25, 1600}},
  };
  return table;
}

/// A Linear layer applied as Python's nn.Linear is: ATen's linear folds a
/// [B, T, C] input into one addmm with the bias. torch::nn::Linear's own
/// forward (the C++ frontend's F::linear) runs it as a matmul and then a
/// separate `+= bias`, and its backward sums the bias gradient apart (GEMM ops
/// 113 -> 99 ms of a gpt-mini single 1x2 step, README "strata vs PyTorch 2.x").
/// Under selective activation checkpointing ("op" policy) every other one is
/// kept for the recompute (checkpointed_linear).
torch::Tensor linear(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return checkpointed_linear(x, layer->weight, layer->bias);
}

/// Dropout on activations that sequence parallelism splits draws this rank's
/// masks (each rank holds other tokens); on whole activations, which every
/// rank of the group holds alike, the shared ones.
torch::Tensor split_dropout(torch::nn::Dropout& dropout, const torch::Tensor& x, const tp::Parallel& tp) {
  const auto tokens = tp.rank_random(tp.sequence_parallel() && dropout->is_training() && dropout->options.p() > 0);
  return dropout(x);
}

/// A LayerNorm whose parameters go through `tp` (sequence parallel: their
/// gradients cover this rank's tokens and are summed over ranks).
torch::Tensor layer_norm(torch::nn::LayerNorm ln, const torch::Tensor& x, const tp::Parallel& tp) {
  if (!tp.sequence_parallel()) return ln(x);
  return torch::layer_norm(x, ln->options.normalized_shape(), tp.replicated(ln->weight), tp.replicated(ln->bias),
                           ln->options.eps());
}

}  // namespace

std::vector<std::string> gpt_preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, dims] : presets()) names.push_back(name);
  return names;
}

GPTOptions gpt_preset(const std::string& name) {
  for (const auto& [preset, dims] : presets()) {
    if (preset == name) return GPTOptions(dims[0], dims[1], dims[2]);
  }
  TORCH_CHECK_VALUE(false, "unknown preset '", name, "'; available: ", c10::Join(", ", gpt_preset_names()));
}

std::vector<std::string> attention_names() { return {"fused", "sdpa", "naive"}; }

double gpt_init_std(int64_t n_embd) {
  constexpr double kGpt2Std = 0.02, kGpt2Width = 768.0;
  if (n_embd <= 0 || static_cast<double>(n_embd) >= kGpt2Width) return kGpt2Std;
  return kGpt2Std * std::sqrt(kGpt2Width / static_cast<double>(n_embd));
}

double init_std_of(const GPTOptions& o) { return o.init_std() > 0 ? o.init_std() : gpt_init_std(o.n_embd()); }

void validate(const GPTOptions& o) {
  TORCH_CHECK_VALUE(o.n_layer() > 0 && o.n_head() > 0 && o.n_embd() > 0 && o.vocab_size() > 0 &&
                        o.block_size() > 0,
                    "model sizes must be > 0 (got n_layer ", o.n_layer(), ", n_head ", o.n_head(),
                    ", n_embd ", o.n_embd(), ", vocab_size ", o.vocab_size(), ", block_size ",
                    o.block_size(), ")");
  TORCH_CHECK_VALUE(o.n_embd() % o.n_head() == 0, "n_embd ", o.n_embd(),
                    " is not divisible by n_head ", o.n_head());
  TORCH_CHECK_VALUE(o.dropout() >= 0.0 && o.dropout() < 1.0, "dropout must be in [0, 1) (got ",
                    o.dropout(), ")");
  const auto names = attention_names();
  TORCH_CHECK_VALUE(std::find(names.begin(), names.end(), o.attention()) != names.end(),
                    "unknown attention '", o.attention(), "'; available: ", c10::Join(", ", names));
  TORCH_CHECK_VALUE(o.activation() == "gelu" || o.activation() == "gelu_new", "unknown activation '", o.activation(),
                    "'; available: gelu, gelu_new");
  TORCH_CHECK_VALUE(std::isfinite(o.init_std()) && o.init_std() >= 0 && o.init_std() < 1,
                    "init_std must be in [0, 1) (0: the width rule), got ", o.init_std());
  TORCH_CHECK_VALUE(o.lora_rank() >= 0 && o.lora_rank() <= o.n_embd(), "lora_rank must be in [0, n_embd ",
                    o.n_embd(), "] (0: off), got ", o.lora_rank());
  if (o.lora_rank() > 0) {
    TORCH_CHECK_VALUE(o.lora_alpha() > 0, "lora_alpha must be > 0, got ", o.lora_alpha());
    parse_lora_targets(o.lora_targets());
  }
}


int64_t count_parameters(const GPTOptions& o) {
  const int64_t c = o.n_embd();
  const int64_t b = o.bias() ? 1 : 0;
  // Per block: two LayerNorms (weight + bias each), c_attn, attn.c_proj, c_fc, c_proj.
  const int64_t block = 2 * 2 * c + (3 * c * c + b * 3 * c) + (c * c + b * c) + (4 * c * c + b * 4 * c) +
                        (4 * c * c + b * c);
  const int64_t embeddings = o.vocab_size() * c + o.block_size() * c;
  const int64_t head = o.tie_weights() ? 0 : o.vocab_size() * c;
  return embeddings + o.n_layer() * block + 2 * c + head + count_lora_parameters(o);
}

tp::Boundaries tensor_parallel_boundaries(const GPTOptions& o, int64_t micro_batch, int64_t sequence,
                                          int64_t checkpoint_every) {
  tp::Boundaries b;
  const int64_t layers = o.n_layer();
  b.activation = micro_batch * sequence * o.n_embd();
  b.forward_sums = 2 * layers + 1;   // attn.c_proj, c_proj per block; the embedding
  b.fp32_forward_sums = 1;           // the embedding's lookup
  b.backward_sums = 2 * layers + 1;  // c_attn's and c_fc's inputs per block; the head's
  b.recomputed_sums = checkpoint_every > 0 ? 2 * ((layers + checkpoint_every - 1) / checkpoint_every) : 0;
  b.loss_positions = micro_batch * sequence;
  const int64_t bias = o.bias() ? 1 : 0;
  b.sequence_parallel_params = layers * (4 + 2 * bias) * o.n_embd() + 2 * o.n_embd() + o.block_size() * o.n_embd();
  if (o.lora_rank() == 0) return b;
  // LoRA: the base is frozen, so the embedding's sum and the first block's
  // layers before an adapter pass no gradient back (only c_attn's input
  // with attention adapters; c_fc's and attn.c_proj's output too without).
  const auto targets = parse_lora_targets(o.lora_targets());
  const int64_t adapters = (targets.attn ? 1 : 0) + (targets.mlp ? 1 : 0);  // column ones = row ones, per block
  b.forward_sums_without_gradient = targets.attn ? 1 : 2;
  b.backward_sums_without_gradient = targets.attn ? 1 : 2;
  // Each adapter pair: the column one's r features cross backward (its A
  // product is whole), the row one's forward.
  b.adapter_activation = micro_batch * sequence * o.lora_rank();
  b.adapter_forward_sums = layers * adapters;
  b.adapter_backward_sums = layers * adapters;
  b.adapter_recomputed_sums = checkpoint_every > 0 ? adapters * ((layers + checkpoint_every - 1) / checkpoint_every) : 0;
  b.adapter_recomputed_gathers = b.adapter_recomputed_sums;  // a column adapter for each row one
  // Only adapters train: the summed replicated gradients are the column
  // adapters' A and the row adapters' B, C·r each.
  b.sequence_parallel_params = layers * adapters * 2 * o.lora_rank() * o.n_embd();
  return b;
}

int64_t count_tensor_parallel_block_parameters(const GPTOptions& o, int size) {
  const int64_t c = o.n_embd(), bias = o.bias() ? 1 : 0;
  return (12 * c * c + 7 * c * bias) / size + 4 * c + 2 * c * bias;
}

int64_t count_tensor_parallel_parameters(const GPTOptions& o, int size) {
  const int64_t rows = (o.vocab_size() + size - 1) / size;  // the largest part
  const int64_t c = o.n_embd();
  const int64_t head = o.tie_weights() ? 0 : rows * c;
  return rows * c + o.block_size() * c + 2 * c + head + o.n_layer() * count_tensor_parallel_block_parameters(o, size) +
         count_lora_parameters(o, size);
}

int64_t count_trainable_parameters(const GPTOptions& o) {
  return o.lora_rank() > 0 ? count_lora_parameters(o) : count_parameters(o);
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTOptions& o)
    : n_head_(o.n_head()), attention_(o.attention()), attn_dropout_p_(o.dropout()) {
  c_attn_ = register_module("c_attn", torch::nn::Linear(torch::nn::LinearOptions(o.n_embd(), 3 * o.n_embd()).bias(o.bias())));
  c_proj_ = register_module("c_proj", torch::nn::Linear(torch::nn::LinearOptions(o.n_embd(), o.n_embd()).bias(o.bias())));
  const bool lora = o.lora_rank() > 0 && parse_lora_targets(o.lora_targets()).attn;
  if (lora) {
    c_attn_lora_ = register_module("c_attn_lora", LoRA(o.n_embd(), 3 * o.n_embd(), o.lora_rank(), o.lora_alpha()));
    c_proj_lora_ = register_module("c_proj_lora", LoRA(o.n_embd(), o.n_embd(), o.lora_rank(), o.lora_alpha()));
  }
  attn_dropout_ = register_module("attn_dropout", torch::nn::Dropout(o.dropout()));
  resid_dropout_ = register_module("resid_dropout", torch::nn::Dropout(o.dropout()));
}

std::array<torch::Tensor, 3> CausalSelfAttentionImpl::heads(const torch::Tensor& x) {
  // Tensor parallel: this rank's heads (its Q, K and V rows of c_attn); the
  // sequence is whole here even under sequence parallelism.
  auto projected = tp_.on() ? tp_.column(x, c_attn_->weight, c_attn_->bias) : linear(c_attn_, x);
  if (c_attn_lora_) projected = projected + (tp_.on() ? c_attn_lora_->column_parallel(x, tp_) : c_attn_lora_(x));
  const auto B = projected.size(0), T = projected.size(1), C = projected.size(2) / 3;
  const auto n_head = tp_.on() ? tp_.local(n_head_) : n_head_;
  const auto hd = C / n_head;
  auto qkv = projected.split(C, /*dim=*/2);
  return {qkv[0].view({B, T, n_head, hd}).transpose(1, 2), qkv[1].view({B, T, n_head, hd}).transpose(1, 2),
          qkv[2].view({B, T, n_head, hd}).transpose(1, 2)};
}

torch::Tensor CausalSelfAttentionImpl::project(const torch::Tensor& attended) {
  const auto B = attended.size(0), T = attended.size(2);
  const auto y = attended.transpose(1, 2).contiguous().view({B, T, -1});
  auto out = tp_.on() ? tp_.row(y, c_proj_->weight, c_proj_->bias) : linear(c_proj_, y);
  if (c_proj_lora_) out = out + (tp_.on() ? c_proj_lora_->row_parallel(y, tp_) : c_proj_lora_(y));
  return split_dropout(resid_dropout_, out, tp_);
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const auto [q, k, v] = heads(x);
  torch::Tensor y;
  {
    // Tensor parallel: each rank holds other heads, so their dropout masks
    // differ (the rank's own stream, as Megatron's model-parallel RNG region).
    const auto heads = tp_.rank_random(attn_dropout_p_ > 0 && is_training());
    if (attention_ == "fused" && x.device().is_cpu()) {
      // Dropout inside the kernel: one seed from the default generator per call.
      // The default on CPU: faster than ATen's SDPA CPU kernel at every block
      // size measured (README, micro-benchmarks).
      y = fused_attention(q, k, v, attn_dropout_p_, is_training());
    } else if (attention_ == "sdpa" || (attention_ == "fused" && !x.device().is_cpu())) {
      // LibTorch's fused attention (CUDA: flash / cuDNN / memory-efficient
      // kernels, chosen by ATen; CPU: its flash-style kernel): no [B, H, T, T]
      // scores in memory. Dropout draws from the device's generator, which
      // activation checkpointing replays.
      y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, is_training() ? attn_dropout_p_ : 0.0,
                                           /*is_causal=*/true);
    } else {
      y = torch::matmul(attn_dropout_(kernels::naive_causal_probs(q, k)), v);
    }
  }
  return project(y);
}

BlockImpl::BlockImpl(const GPTOptions& o) : approximate_(o.activation() == "gelu_new" ? "tanh" : "none") {
  ln_1_ = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.n_embd()}).elementwise_affine(true)));
  attn_ = register_module("attn", CausalSelfAttention(o));
  ln_2_ = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.n_embd()}).elementwise_affine(true)));
  c_fc_ = register_module("c_fc", torch::nn::Linear(torch::nn::LinearOptions(o.n_embd(), 4 * o.n_embd()).bias(o.bias())));
  c_proj_ = register_module("c_proj", torch::nn::Linear(torch::nn::LinearOptions(4 * o.n_embd(), o.n_embd()).bias(o.bias())));
  if (o.lora_rank() > 0 && parse_lora_targets(o.lora_targets()).mlp) {
    c_fc_lora_ = register_module("c_fc_lora", LoRA(o.n_embd(), 4 * o.n_embd(), o.lora_rank(), o.lora_alpha()));
    c_proj_lora_ = register_module("c_proj_lora", LoRA(4 * o.n_embd(), o.n_embd(), o.lora_rank(), o.lora_alpha()));
  }
  dropout_ = register_module("dropout", torch::nn::Dropout(o.dropout()));
}

void BlockImpl::set_tensor_parallel(const tp::Parallel& tp) {
  tp_ = tp;
  attn_->set_tensor_parallel(tp);
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  if (tp_.on()) {
    // Megatron's MLP: c_fc column-parallel, c_proj row-parallel (one sum
    // over ranks per pair, forward and backward).
    auto h = x + attn_(layer_norm(ln_1_, x, tp_));
    const auto in = layer_norm(ln_2_, h, tp_);
    auto fc = tp_.column(in, c_fc_->weight, c_fc_->bias);
    if (c_fc_lora_) fc = fc + c_fc_lora_->column_parallel(in, tp_);
    const auto mid = torch::gelu(fc, approximate_);
    auto out = tp_.row(mid, c_proj_->weight, c_proj_->bias);
    if (c_proj_lora_) out = out + c_proj_lora_->row_parallel(mid, tp_);
    return h + split_dropout(dropout_, out, tp_);
  }
  const auto h = x + attn_(ln_1_(x));
  return h + mlp(ln_2_(h));
}

torch::Tensor BlockImpl::mlp(const torch::Tensor& in) {
  const auto mid = torch::gelu(c_fc_lora_ ? linear(c_fc_, in) + c_fc_lora_(in) : linear(c_fc_, in), approximate_);
  // The block's output reads c_proj's only through dropout and the residual
  // add, whose backward needs no values: a checkpoint's recompute skips this
  // GEMM (strategies/activation_checkpoint.h).
  auto out = linear_output_unread_in_recompute(mid, c_proj_->weight, c_proj_->bias);
  if (c_proj_lora_) out = out + c_proj_lora_(mid);
  return dropout_(out);
}

GPTImpl::GPTImpl(const GPTOptions& o, bool deferred)
    : options_(o), init_seed_(at::detail::getDefaultCPUGenerator().current_seed()) {
  validate(o);
  // Deferred: each submodule is built as usual (its default init consumes
  // the default generator as in an eager build, so dropout streams match),
  // then gives its memory back at once.
  auto add = [this, deferred](const std::string& name, auto module) {
    auto registered = register_module(name, std::move(module));
    if (deferred) defer_parameters(*registered);
    return registered;
  };
  wte_ = add("wte", torch::nn::Embedding(o.vocab_size(), o.n_embd()));
  wpe_ = add("wpe", torch::nn::Embedding(o.block_size(), o.n_embd()));
  drop_ = add("drop", torch::nn::Dropout(o.dropout()));
  for (int64_t i = 0; i < o.n_layer(); ++i) {
    blocks_.push_back(add(c10::str("h", i), Block(o)));
  }
  ln_f_ = add("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.n_embd()})));
  if (!o.tie_weights()) {
    lm_head_ = add("lm_head", torch::nn::Linear(torch::nn::LinearOptions(o.n_embd(), o.vocab_size()).bias(false)));
  }
  for (const auto& p : parameters()) num_params_ += p.numel();
  if (o.lora_rank() > 0) {
    // Fine-tuning: only the adapters train; strategies leave frozen
    // parameters out of gradients, optimizer state and communication.
    for (auto& item : named_parameters()) {
      if (!is_lora_parameter(item.key())) item.value().requires_grad_(false);
    }
  }
  if (deferred) return;
  for (const auto& item : named_parameters()) init_parameter(item.key(), item.value());
}

void GPTImpl::init_parameter(const std::string& name, const torch::Tensor& p) const {
  torch::NoGradGuard no_grad;
  auto ends_with = [&name](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (is_lora_parameter(name)) {
    init_lora_parameter(name, p, parameter_generator(init_seed_, name));
  } else if (name.find("ln_") != std::string::npos) {
    // LayerNorm: weight 1, bias 0 (torch's default, written here so a
    // deferred build gets it too).
    if (ends_with("weight")) {
      p.fill_(1.0);
    } else {
      p.zero_();
    }
  } else if (p.dim() == 1) {
    p.zero_();
  } else {
    const double std_all = init_std_of(options_);
    const double stddev = ends_with("c_proj.weight")
                              ? std_all / std::sqrt(2.0 * static_cast<double>(options_.n_layer()))
                              : std_all;
    normal_init(p, 0.0, stddev, parameter_generator(init_seed_, name));
  }
}

void GPTImpl::set_tensor_parallel(const tp::Parallel& tp) {
  tp_ = tp;
  for (auto& block : blocks_) block->set_tensor_parallel(tp);
}

torch::Tensor GPTImpl::embed(const torch::Tensor& idx) {
  const auto T = idx.size(1);
  TORCH_CHECK(T <= options_.block_size(), "sequence length ", T, " exceeds block_size ",
              options_.block_size());
  auto pos = torch::arange(T, idx.options());
  // Tensor parallel: the vocabulary-parallel lookup, whole (or this rank's
  // part of the sequence, as the position embeddings added to it).
  return tp_.on() ? split_dropout(drop_,
                                  tp_.embedding(idx, wte_->weight, options_.vocab_size()) +
                                      tp_.sequence_part(torch::embedding(tp_.replicated(wpe_->weight), pos).unsqueeze(0)),
                                  tp_)
                  : drop_(wte_(idx) + wpe_(pos));
}

torch::Tensor GPTImpl::head(const torch::Tensor& x) {
  const auto y = layer_norm(ln_f_, x, tp_);
  // Tensor parallel: this rank's part of the vocabulary (column-parallel head).
  if (tp_.on()) return tp_.column(y, lm_head_ ? lm_head_->weight : wte_->weight, {});
  return lm_head_ ? lm_head_(y) : torch::matmul(y, wte_->weight.t());
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx, const UnitRunner& run_unit) {
  auto x = embed(idx);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (!run_unit) {
      x = blocks_[i](x);
      continue;
    }
    // The block by value: a runner may keep this forward and call it again
    // during backward (activation checkpointing recomputes the block).
    x = run_unit(static_cast<int64_t>(i), x,
                 [block = blocks_[i].ptr()](const torch::Tensor& t) { return block->forward(t); });
  }
  return head(x);
}

int64_t GPTImpl::num_params(bool non_embedding) const {
  return non_embedding ? num_params_ - options_.block_size() * options_.n_embd() : num_params_;
}

GPTModule::GPTModule(const GPTOptions& options, bool deferred) : model_(options, deferred) {}

void GPTModule::init_parameter(const std::string& name, const torch::Tensor& param) {
  model_->init_parameter(name, param);
}

torch::Tensor GPTModule::forward(const torch::Tensor& idx) {
  return model_->forward(idx, [this](int64_t unit, const torch::Tensor& x, const UnitFn& block) {
    return run_unit(unit, x, block);
  });
}

torch::Tensor GPTModule::training_step(const Batch& batch) {
  return lm_loss(forward(batch.input), batch.target, model_->tensor_parallel(), model_->options().vocab_size());
}

ValidationStep GPTModule::validation_step(const Batch& batch) {
  return lm_validation(forward(batch.input), batch, model_->tensor_parallel(), model_->options().vocab_size());
}

tp::Plan GPTModule::tensor_parallel_plan() const {
  tp::Plan plan{{"wte", tp::Style::kVocab},
                // Q, K and V are three blocks of c_attn's output: each rank holds its heads of each.
                {"h*.attn.c_attn", tp::Style::kColwise, 3},
                {"h*.attn.c_proj", tp::Style::kRowwise},
                {"h*.c_fc", tp::Style::kColwise},
                {"h*.c_proj", tp::Style::kRowwise}};
  // The head: the embedding's matrix when tied, else its own (a rule that
  // matches nothing is an error).
  if (!model_->options().tie_weights()) plan.push_back({"lm_head", tp::Style::kColwise});
  // LoRA adapters split beside their Linear: a column-parallel Linear's B by
  // its output features, a row-parallel one's A by its input features; the
  // other matrix stays whole (recipes/models/lora.h).
  const auto& o = model_->options();
  if (o.lora_rank() > 0) {
    const auto targets = parse_lora_targets(o.lora_targets());
    if (targets.attn) {
      plan.push_back({"h*.attn.c_attn_lora", tp::Style::kColwise, 3, "B"});
      plan.push_back({"h*.attn.c_proj_lora", tp::Style::kRowwise, 1, "A"});
    }
    if (targets.mlp) {
      plan.push_back({"h*.c_fc_lora", tp::Style::kColwise, 1, "B"});
      plan.push_back({"h*.c_proj_lora", tp::Style::kRowwise, 1, "A"});
    }
  }
  return plan;
}

std::string GPTModule::tensor_parallel_problem(int size, bool sequence_parallel) const {
  return recipes::tensor_parallel_problem(model_->options(), size, sequence_parallel);
}

std::string tensor_parallel_problem(const GPTOptions& o, int size, bool sequence_parallel) {
  if (size <= 1) return "";
  if (o.n_head() % size != 0) {
    return c10::str("tensor-parallel size ", size, " must divide n_head ", o.n_head(), ": each rank computes whole heads");
  }
  if ((4 * o.n_embd()) % size != 0) {
    return c10::str("tensor-parallel size ", size, " must divide the MLP's width 4 x n_embd = ", 4 * o.n_embd());
  }
  if (o.vocab_size() < size) {
    return c10::str("tensor-parallel size ", size, " exceeds the vocabulary ", o.vocab_size(),
                    ": each rank holds at least one of its rows");
  }
  if (sequence_parallel && o.block_size() % size != 0) {
    return c10::str("sequence parallelism: block size ", o.block_size(), " does not divide by the tensor-parallel size ",
                    size);
  }
  return "";
}

std::vector<std::shared_ptr<torch::nn::Module>> GPTModule::wrap_units() {
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  for (auto& block : model_->blocks()) units.push_back(block.ptr());
  return units;
}

double GPTModule::flops_per_token() const { return gpt_flops_per_token(model_->options()); }

double gpt_flops_per_token(const GPTOptions& o) {
  const double n = static_cast<double>(count_parameters(o) - o.block_size() * o.n_embd());
  const double l = o.n_layer(), h = o.n_head(), q = o.n_embd() / o.n_head(), t = o.block_size();
  // LoRA: frozen weights take no weight-gradient product, 4 FLOPs per
  // parameter and token (forward, input gradient) instead of 6.
  const double trainable = o.lora_rank() > 0 ? static_cast<double>(count_lora_parameters(o)) : n;
  return 4.0 * n + 2.0 * trainable + 12.0 * l * h * q * t;
}

}  // namespace strata::recipes
