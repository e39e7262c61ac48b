#include "strata/recipes/models/llama/llama.h"

#include "strata/core/deferred_init.h"
#include "strata/kernels/float_dispatch.h"
#include "strata/kernels/rms_norm.h"
#include "strata/kernels/rope.h"
#include "strata/kernels/swiglu.h"
#include "strata/recipes/models/lm.h"
#include "strata/strategies/activation_checkpoint.h"
#include "strata/strategies/tp/parallel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace strata::recipes {
namespace {

/// A Linear as GPT's are applied: ATen's linear (one addmm with the bias),
/// kept for the recompute under the "op" checkpointing policy.
torch::Tensor project(const Projection& layer, const torch::Tensor& x) {
  return checkpointed_linear(x, layer->weight, layer->bias);
}

/// Whether strata's fused CPU kernel runs the attention: --attention fused
/// on a CPU (elsewhere ATen's SDPA).
bool fused_here(const LlamaOptions& o, const torch::Device& device) {
  return o.attention() == "fused" && device.is_cpu();
}

/// Causal attention of each kv head's query group: q [B, Hkv, G·T, D] (the G
/// query heads of one kv head laid end to end), k and v [B, Hkv, T, D], so
/// that k and v are read by all G heads without being repeated; `mask` as
/// attention_inputs makes it (undefined: G = 1, plain causal).
torch::Tensor grouped_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                       const torch::Tensor& mask, bool naive) {
  if (!naive) {
    return mask.defined() ? at::scaled_dot_product_attention(q, k, v, mask)
                          : at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  }
  const auto allowed = mask.defined() ? mask : torch::ones({q.size(2), k.size(2)}, q.options().dtype(torch::kBool)).tril();
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores.to(torch::kFloat32), -1).to(q.scalar_type()), v);
}

}  // namespace

void validate(const LlamaOptions& o) {
  TORCH_CHECK_VALUE(o.n_layer() > 0 && o.n_head() > 0 && o.n_embd() > 0 && o.intermediate_size() > 0 &&
                        o.vocab_size() > 0 && o.block_size() > 0 && o.n_kv_head() >= 0 && o.head_dim() >= 0,
                    "model sizes must be > 0 (got n_layer ", o.n_layer(), ", n_head ", o.n_head(), ", n_embd ",
                    o.n_embd(), ", intermediate_size ", o.intermediate_size(), ", vocab_size ", o.vocab_size(),
                    ", block_size ", o.block_size(), ", n_kv_head ", o.n_kv_head(), ", head_dim ", o.head_dim(), ")");
  TORCH_CHECK_VALUE(o.head_dim() > 0 || o.n_embd() % o.n_head() == 0, "n_embd ", o.n_embd(),
                    " is not divisible by n_head ", o.n_head(), " (or give head_dim)");
  TORCH_CHECK_VALUE(o.n_head() % o.kv_heads() == 0, "n_kv_head ", o.kv_heads(), " does not divide n_head ", o.n_head());
  TORCH_CHECK_VALUE(o.head_size() % 2 == 0, "head size ", o.head_size(), " is odd: RoPE rotates pairs of features");
  TORCH_CHECK_VALUE(o.sliding_window() == 0 || o.sliding_window() >= o.block_size(), "sliding_window ",
                    o.sliding_window(), " is shorter than the block size ", o.block_size(),
                    ": strata runs full causal attention; use a block size <= ", o.sliding_window());
  const auto& s = o.rope_scaling();
  TORCH_CHECK_VALUE(s.type == "none" || s.type == "linear" || s.type == "llama3", "rope scaling '", s.type,
                    "' is not supported; available: none, linear, llama3");
  TORCH_CHECK_VALUE(s.type == "none" || s.factor > 0, "rope scaling factor must be > 0, got ", s.factor);
  TORCH_CHECK_VALUE(s.type != "llama3" || (s.high_freq_factor > s.low_freq_factor && s.original_max_position > 0),
                    "llama3 rope scaling needs high_freq_factor > low_freq_factor and original_max_position > 0 (got ",
                    s.high_freq_factor, ", ", s.low_freq_factor, ", ", s.original_max_position, ")");
  TORCH_CHECK_VALUE(o.rope_theta() > 0, "rope_theta must be > 0, got ", o.rope_theta());
  TORCH_CHECK_VALUE(o.rms_norm_eps() > 0, "rms_norm_eps must be > 0, got ", o.rms_norm_eps());
  TORCH_CHECK_VALUE(o.attention() == "fused" || o.attention() == "sdpa" || o.attention() == "naive",
                    "unknown attention '", o.attention(), "'; available: fused, sdpa, naive");
  TORCH_CHECK_VALUE(o.lora_rank() >= 0 && o.lora_rank() <= o.n_embd(), "lora_rank must be in [0, n_embd ",
                    o.n_embd(), "] (0: off), got ", o.lora_rank());
  if (o.lora_rank() == 0) return;
  TORCH_CHECK_VALUE(o.lora_alpha() > 0, "lora_alpha must be > 0, got ", o.lora_alpha());
  parse_llama_lora_targets(o.lora_targets());
}

int64_t count_parameters(const LlamaOptions& o) {
  const int64_t c = o.n_embd(), d = o.head_size(), q = o.n_head() * d, kv = o.kv_heads() * d;
  const int64_t f = o.intermediate_size();
  const int64_t attention = c * q + 2 * c * kv + q * c + (o.qkv_bias() ? q + 2 * kv : 0) + (o.o_bias() ? c : 0) +
                            (o.qk_norm() ? 2 * d : 0);
  const int64_t mlp = 3 * c * f + (o.mlp_bias() ? 2 * f + c : 0);
  const int64_t head = o.tie_weights() ? 0 : o.vocab_size() * c;
  return o.vocab_size() * c + o.n_layer() * (attention + mlp + 2 * c) + c + head + count_llama_lora_parameters(o);
}

torch::Tensor rope_inverse_frequencies(const LlamaOptions& o) {
  const int64_t d = o.head_size();
  auto exponent = torch::arange(0, d, 2, torch::kLong).to(torch::kFloat32) / static_cast<double>(d);
  auto inv = 1.0 / torch::pow(o.rope_theta(), exponent);
  const auto& s = o.rope_scaling();
  if (s.type == "linear") return inv / s.factor;
  if (s.type != "llama3") return inv;
  // Llama 3.1: wavelengths longer than the original context / low_freq_factor
  // are divided by factor, shorter than / high_freq_factor kept, and those in
  // between interpolated (transformers' _compute_llama3_parameters).
  const double old = static_cast<double>(s.original_max_position);
  const double low_wavelen = old / s.low_freq_factor, high_wavelen = old / s.high_freq_factor;
  auto wavelen = 2 * std::numbers::pi / inv;
  auto scaled = torch::where(wavelen > low_wavelen, inv / s.factor, inv);
  auto smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  auto smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  auto medium = wavelen.ge(high_wavelen).logical_and(wavelen.le(low_wavelen));
  return torch::where(medium, smoothed, scaled);
}

AttentionInputs attention_inputs(const torch::Tensor& inverse_frequencies, int64_t T, int64_t group,
                                 const torch::Device& device, int64_t start) {
  AttentionInputs in;
  auto positions = torch::arange(start, start + T, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  auto freqs = torch::outer(positions, inverse_frequencies.to(device));  // [T, D/2], fp32
  auto angles = torch::cat({freqs, freqs}, -1);
  in.cos = angles.cos();
  in.sin = angles.sin();
  if (group > 1) {
    const auto longs = torch::TensorOptions().dtype(torch::kLong).device(device);
    auto rows = torch::arange(group * T, longs).remainder(T);
    in.mask = torch::arange(T, longs).unsqueeze(0).le(rows.unsqueeze(1));  // [G·T, T]
  }
  return in;
}

torch::Tensor apply_rope(const torch::Tensor& x, const AttentionInputs& in) {
  // On a CPU the fused kernel (kernels/rope.h): one pass each way, no rotated copy.
  if (x.device().is_cpu() && kernels::is_dispatched_float(x.scalar_type()) && x.stride(3) == 1) {
    return kernels::rope(x, in.cos, in.sin);
  }
  const auto half = x.size(3) / 2;
  auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * in.cos.to(x.scalar_type()) + rotated * in.sin.to(x.scalar_type());
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  // On a CPU the fused kernel (kernels/rms_norm.h): one pass each way, and
  // backward keeps x and one number per row instead of the normalised x too.
  if (x.device().is_cpu() && weight.device().is_cpu() && kernels::is_dispatched_float(x.scalar_type()) &&
      x.numel() > 0) {
    return kernels::rms_norm(x, weight, eps);
  }
  return rms_norm_composite(x, weight, eps);
}

torch::Tensor rms_norm_composite(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  auto h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * h.to(x.scalar_type());
}

ProjectionImpl::ProjectionImpl(int64_t in, int64_t out, bool with_bias, bool deferred) {
  const auto options = torch::TensorOptions().device(deferred ? torch::kMeta : torch::kCPU);
  weight = register_parameter("weight", torch::empty({out, in}, options));
  if (with_bias) bias = register_parameter("bias", torch::empty({out}, options));
}

RMSNormImpl::RMSNormImpl(int64_t size, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({size}));
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaOptions& o, bool deferred) : options_(o) {
  const int64_t c = o.n_embd(), d = o.head_size();
  q_proj_ = register_module("q_proj", Projection(c, o.n_head() * d, o.qkv_bias(), deferred));
  k_proj_ = register_module("k_proj", Projection(c, o.kv_heads() * d, o.qkv_bias(), deferred));
  v_proj_ = register_module("v_proj", Projection(c, o.kv_heads() * d, o.qkv_bias(), deferred));
  o_proj_ = register_module("o_proj", Projection(o.n_head() * d, c, o.o_bias(), deferred));
  if (o.qk_norm()) {
    q_norm_ = register_module("q_norm", RMSNorm(d, o.rms_norm_eps()));
    k_norm_ = register_module("k_norm", RMSNorm(d, o.rms_norm_eps()));
  }
  if (o.lora_rank() == 0) return;
  const auto t = parse_llama_lora_targets(o.lora_targets());
  auto adapter = [&](bool on, const char* name, int64_t in, int64_t out) {
    return on ? register_module(name, LoRA(in, out, o.lora_rank(), o.lora_alpha())) : LoRA(nullptr);
  };
  q_lora_ = adapter(t.q, "q_proj_lora", c, o.n_head() * d);
  k_lora_ = adapter(t.k, "k_proj_lora", c, o.kv_heads() * d);
  v_lora_ = adapter(t.v, "v_proj_lora", c, o.kv_heads() * d);
  o_lora_ = adapter(t.o, "o_proj_lora", o.n_head() * d, c);
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const AttentionInputs& in) {
  // Tensor parallel: this rank's query heads and the kv heads they read (the
  // sequence is whole here even under sequence parallelism).
  // q, k and v read one whole input: one crossing for the three.
  const auto whole = tp_.column_input(x);
  auto proj = [&](const Projection& l, LoRA lora) {
    auto y = tp_.on() ? torch::linear(whole, l->weight, l->bias) : project(l, x);
    if (lora) y = y + (tp_.on() ? lora->column_parallel(x, tp_) : lora(x));
    return y;
  };
  const int64_t h = tp_.on() ? tp_.local(options_.n_head()) : options_.n_head();
  const int64_t kv = tp_.on() ? tp_.local(options_.kv_heads()) : options_.kv_heads();
  const int64_t d = options_.head_size(), g = h / kv;
  auto q = proj(q_proj_, q_lora_);
  const auto B = q.size(0), T = q.size(1);
  q = q.view({B, T, h, d});
  auto k = proj(k_proj_, k_lora_).view({B, T, kv, d});
  auto v = proj(v_proj_, v_lora_).view({B, T, kv, d}).transpose(1, 2);
  if (options_.qk_norm()) {
    // Tensor parallel: the norms' weights act on this rank's heads only.
    q = rms_norm(q, tp_.replicated_on_parts(q_norm_->weight), options_.rms_norm_eps());
    k = rms_norm(k, tp_.replicated_on_parts(k_norm_->weight), options_.rms_norm_eps());
  }
  q = apply_rope(q.transpose(1, 2), in);  // [B, H, T, D]
  k = apply_rope(k.transpose(1, 2), in);
  torch::Tensor y;
  if (in.cache != nullptr) {
    y = cached_attention(q, k, v, in).transpose(1, 2).reshape({B, T, h * d});
  } else if (fused_here(options_, x.device())) {
    // strata's kernel reads kv head j / g for query head j (no repeat, no
    // mask); its output's memory is already [B, T, H, D].
    y = fused_attention(q, k, v, 0.0, is_training())
            .transpose(1, 2)
            .reshape({B, T, h * d});
  } else {
    // Query head j reads kv head j / g (transformers' repeat_kv order): the g
    // heads of one kv head become one sequence of g·T rows.
    y = grouped_causal_attention(q.reshape({B, kv, g * T, d}), k, v, in.mask, options_.attention() == "naive");
    y = y.view({B, h, T, d}).transpose(1, 2).reshape({B, T, h * d});
  }
  auto out = tp_.on() ? tp_.row(y, o_proj_->weight, o_proj_->bias) : project(o_proj_, y);
  if (o_lora_) out = out + (tp_.on() ? o_lora_->row_parallel(y, tp_) : o_lora_(y));
  return out;
}

torch::Tensor LlamaAttentionImpl::cached_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                                  const AttentionInputs& in) const {
  KVCache& cache = *in.cache;
  if (cache.k[in.layer].defined()) {
    k = torch::cat({cache.k[in.layer], k}, 2);
    v = torch::cat({cache.v[in.layer], v}, 2);
  }
  cache.k[in.layer] = k;
  cache.v[in.layer] = v;
  // Inference only: kv heads repeated for their query groups (transformers'
  // repeat_kv). The prompt attends causally; a single new token attends to
  // every position so far.
  const int64_t g = q.size(1) / k.size(1);
  if (g > 1) {
    k = k.repeat_interleave(g, 1);
    v = v.repeat_interleave(g, 1);
  }
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/q.size(2) > 1);
}

LlamaBlockImpl::LlamaBlockImpl(const LlamaOptions& o, bool deferred) {
  input_layernorm_ = register_module("input_layernorm", RMSNorm(o.n_embd(), o.rms_norm_eps()));
  self_attn_ = register_module("self_attn", LlamaAttention(o, deferred));
  post_attention_layernorm_ = register_module("post_attention_layernorm", RMSNorm(o.n_embd(), o.rms_norm_eps()));
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  const int64_t c = o.n_embd(), f = o.intermediate_size();
  gate_proj_ = mlp->register_module("gate_proj", Projection(c, f, o.mlp_bias(), deferred));
  up_proj_ = mlp->register_module("up_proj", Projection(c, f, o.mlp_bias(), deferred));
  down_proj_ = mlp->register_module("down_proj", Projection(f, c, o.mlp_bias(), deferred));
  if (o.lora_rank() == 0) return;
  const auto t = parse_llama_lora_targets(o.lora_targets());
  auto adapter = [&](bool on, const char* name, int64_t in, int64_t out) {
    return on ? mlp->register_module(name, LoRA(in, out, o.lora_rank(), o.lora_alpha())) : LoRA(nullptr);
  };
  gate_lora_ = adapter(t.gate, "gate_proj_lora", o.n_embd(), o.intermediate_size());
  up_lora_ = adapter(t.up, "up_proj_lora", o.n_embd(), o.intermediate_size());
  down_lora_ = adapter(t.down, "down_proj_lora", o.intermediate_size(), o.n_embd());
}

void LlamaBlockImpl::set_tensor_parallel(const tp::Parallel& tp) {
  tp_ = tp;
  self_attn_->set_tensor_parallel(tp);
}

torch::Tensor LlamaBlockImpl::forward(const torch::Tensor& x, const AttentionInputs& attention) {
  auto h = x + self_attn_(input_layernorm_(x, tp_), attention);
  const auto in = post_attention_layernorm_(h, tp_);
  // LoRA: an adapter's output beside its projection's (column- or
  // row-parallel like it under tensor parallelism).
  auto adapted = [&](torch::Tensor y, LoRA lora, const torch::Tensor& input, bool column) {
    if (!lora) return y;
    if (!tp_.on()) return y + lora(input);
    return y + (column ? lora->column_parallel(input, tp_) : lora->row_parallel(input, tp_));
  };
  if (tp_.on()) {
    // Megatron's MLP: gate and up column-parallel on one whole input, down
    // row-parallel (one sum over ranks forward, one backward).
    const auto whole = tp_.column_input(in);
    const auto gate = adapted(torch::linear(whole, gate_proj_->weight, gate_proj_->bias), gate_lora_, in, true);
    const auto up = adapted(torch::linear(whole, up_proj_->weight, up_proj_->bias), up_lora_, in, true);
    const auto mid = kernels::swiglu(gate, up);
    return h + adapted(tp_.row(mid, down_proj_->weight, down_proj_->bias), down_lora_, mid, false);
  }
  // SwiGLU fused (kernels/swiglu.h): backward keeps gate and up, not silu(gate) too.
  const auto mid = kernels::swiglu(adapted(project(gate_proj_, in), gate_lora_, in, true),
                                   adapted(project(up_proj_, in), up_lora_, in, true));
  // The block's output reads down_proj's only through the residual add, whose
  // backward needs no values: a checkpoint's recompute skips this GEMM.
  return h + adapted(linear_output_unread_in_recompute(mid, down_proj_->weight, down_proj_->bias), down_lora_, mid,
                     false);
}

LlamaImpl::LlamaImpl(const LlamaOptions& o, bool deferred)
    : options_(o), init_seed_(at::detail::getDefaultCPUGenerator().current_seed()) {
  validate(o);
  inverse_frequencies_ = rope_inverse_frequencies(o);
  body_ = register_module("model", std::make_shared<torch::nn::Module>());
  // The matrices are made without values (Projection): a deferred build
  // allocates nothing of them; an eager one fills them below.
  embed_tokens_ = body_->register_module("embed_tokens", Projection(o.n_embd(), o.vocab_size(), false, deferred));
  auto layers = body_->register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < o.n_layer(); ++i) {
    blocks_.push_back(layers->register_module(std::to_string(i), LlamaBlock(o, deferred)));
    if (deferred) defer_parameters(*blocks_.back());  // the norms and LoRA's adapters
  }
  norm_ = body_->register_module("norm", RMSNorm(o.n_embd(), o.rms_norm_eps()));
  if (!o.tie_weights()) lm_head_ = register_module("lm_head", Projection(o.n_embd(), o.vocab_size(), false, deferred));
  if (o.lora_rank() > 0) {
    // Fine-tuning: only the adapters train; strategies leave frozen
    // parameters out of gradients, optimizer state and communication.
    for (auto& item : named_parameters()) {
      if (!is_lora_parameter(item.key())) item.value().requires_grad_(false);
    }
  }
  if (deferred) {
    defer_parameters(*this);
    return;
  }
  for (const auto& item : named_parameters()) init_parameter(item.key(), item.value());
}

void LlamaImpl::init_parameter(const std::string& name, const torch::Tensor& p) const {
  torch::NoGradGuard no_grad;
  if (is_lora_parameter(name)) {
    init_lora_parameter(name, p, parameter_generator(init_seed_, name));
  } else if (name.ends_with("norm.weight")) {
    p.fill_(1.0);
  } else if (p.dim() == 1) {
    p.zero_();
  } else {
    normal_init(p, 0.0, 0.02, parameter_generator(init_seed_, name));
  }
}

void LlamaImpl::set_tensor_parallel(const tp::Parallel& tp) {
  tp_ = tp;
  for (auto& block : blocks_) block->set_tensor_parallel(tp);
}

torch::Tensor LlamaImpl::forward(const torch::Tensor& idx, const UnitRunner& run_unit) {
  return head(run_blocks(embed(idx), idx.size(1), 0, int64_t(blocks_.size()), run_unit));
}

torch::Tensor LlamaImpl::embed(const torch::Tensor& idx) {
  TORCH_CHECK_VALUE(idx.size(1) <= options_.block_size(), "sequence length ", idx.size(1), " exceeds block_size ",
                    options_.block_size());
  // Tensor parallel: the vocabulary-parallel lookup, whole (or this rank's
  // part of the sequence).
  return tp_.on() ? tp_.embedding(idx, embed_tokens_->weight, options_.vocab_size())
                  : torch::embedding(embed_tokens_->weight, idx);
}

torch::Tensor LlamaImpl::run_blocks(torch::Tensor x, int64_t T, int64_t from, int64_t to, const UnitRunner& run_unit) {
  // Once per call, for its blocks: the positions are the whole sequence's
  // even when sequence parallelism splits x.
  // (The fused kernel groups queries itself: no mask.)
  const int64_t group = fused_here(options_, x.device()) ? 1 : options_.n_head() / options_.kv_heads();
  const auto in = attention_inputs(inverse_frequencies_, T, group, x.device());
  for (int64_t i = from; i < to; ++i) {
    // By value: a runner may keep this forward and call it again in backward
    // (activation checkpointing recomputes the block).
    UnitFn block = [unit = blocks_[size_t(i)].ptr(), in](const torch::Tensor& t) { return unit->forward(t, in); };
    x = run_unit ? run_unit(i, x, block) : block(x);
  }
  return x;
}

torch::Tensor LlamaImpl::head(const torch::Tensor& x) {
  const auto y = norm_(x, tp_);
  const auto& head = lm_head_ ? lm_head_->weight : embed_tokens_->weight;
  // Tensor parallel: this rank's part of the vocabulary (column-parallel head).
  return tp_.on() ? tp_.column(y, head, {}) : torch::nn::functional::linear(y, head);
}

torch::Tensor LlamaImpl::forward_cached(const torch::Tensor& idx, KVCache& cache) {
  TORCH_CHECK(!tp_.on(), "generation runs without tensor parallelism");
  const int64_t T = idx.size(1), start = cache.length;
  TORCH_CHECK_VALUE(start == 0 || T == 1, "a cached forward takes the prompt first, then one token at a time");
  TORCH_CHECK_VALUE(start + T <= options_.block_size(), "position ", start + T, " exceeds the model's context of ",
                    options_.block_size(), " tokens");
  if (cache.k.empty()) {
    cache.k.resize(blocks_.size());
    cache.v.resize(blocks_.size());
  }
  auto x = torch::embedding(embed_tokens_->weight, idx);
  AttentionInputs in = attention_inputs(inverse_frequencies_, T, 1, idx.device(), start);
  in.cache = &cache;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    in.layer = i;
    x = blocks_[i]->forward(x, in);
  }
  cache.length += T;
  x = norm_(x, tp_);
  return torch::nn::functional::linear(x, lm_head_ ? lm_head_->weight : embed_tokens_->weight);
}

LlamaModule::LlamaModule(const LlamaOptions& options, bool deferred) : model_(options, deferred) {}

void LlamaModule::init_parameter(const std::string& name, const torch::Tensor& param) {
  model_->init_parameter(name, param);
}

torch::Tensor LlamaModule::forward(const torch::Tensor& idx) {
  return model_->forward(idx, [this](int64_t unit, const torch::Tensor& x, const UnitFn& fn) {
    return run_unit(unit, x, fn);
  });
}

torch::Tensor LlamaModule::training_step(const Batch& batch) {
  return lm_loss(forward(batch.input), batch.target, model_->tensor_parallel(), model_->options().vocab_size());
}

ValidationStep LlamaModule::validation_step(const Batch& batch) {
  return lm_validation(forward(batch.input), batch, model_->tensor_parallel(), model_->options().vocab_size());
}

tp::Plan LlamaModule::tensor_parallel_plan() const {
  tp::Plan plan{{"model.embed_tokens", tp::Style::kVocab}};
  for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
    plan.push_back({std::string("model.layers.*.self_attn.") + p, tp::Style::kColwise});
  }
  plan.push_back({"model.layers.*.self_attn.o_proj", tp::Style::kRowwise});
  plan.push_back({"model.layers.*.mlp.gate_proj", tp::Style::kColwise});
  plan.push_back({"model.layers.*.mlp.up_proj", tp::Style::kColwise});
  plan.push_back({"model.layers.*.mlp.down_proj", tp::Style::kRowwise});
  if (!model_->options().tie_weights()) plan.push_back({"lm_head", tp::Style::kColwise});
  // LoRA adapters split beside their projection: a column-parallel one's B
  // by rows, a row-parallel one's A by columns; the other matrix stays whole.
  const auto& o = model_->options();
  if (o.lora_rank() > 0) {
    const auto t = parse_llama_lora_targets(o.lora_targets());
    const std::pair<bool, const char*> columns[] = {{t.q, "self_attn.q_proj"}, {t.k, "self_attn.k_proj"},
                                                    {t.v, "self_attn.v_proj"}, {t.gate, "mlp.gate_proj"},
                                                    {t.up, "mlp.up_proj"}};
    for (const auto& [on, name] : columns) {
      if (on) plan.push_back({std::string("model.layers.*.") + name + "_lora", tp::Style::kColwise, 1, "B"});
    }
    if (t.o) plan.push_back({"model.layers.*.self_attn.o_proj_lora", tp::Style::kRowwise, 1, "A"});
    if (t.down) plan.push_back({"model.layers.*.mlp.down_proj_lora", tp::Style::kRowwise, 1, "A"});
  }
  return plan;
}

std::string LlamaModule::tensor_parallel_problem(int size, bool sequence_parallel) const {
  return recipes::tensor_parallel_problem(model_->options(), size, sequence_parallel);
}

std::string tensor_parallel_problem(const LlamaOptions& o, int size, bool sequence_parallel) {
  if (size <= 1) return "";
  if (o.n_head() % size != 0 || o.kv_heads() % size != 0) {
    return c10::str("tensor-parallel size ", size, " does not divide the ", o.n_head(), " query heads and ",
                    o.kv_heads(), " kv heads (each rank holds whole kv heads with their query groups)");
  }
  if (o.intermediate_size() % size != 0) {
    return c10::str("tensor-parallel size ", size, " does not divide the MLP width ", o.intermediate_size());
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

std::vector<std::shared_ptr<torch::nn::Module>> LlamaModule::wrap_units() {
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  for (auto& block : model_->blocks()) units.push_back(block.ptr());
  return units;
}

double LlamaModule::flops_per_token() const { return llama_flops_per_token(model_->options()); }

double llama_flops_per_token(const LlamaOptions& o) {
  const double lookup = o.tie_weights() ? 0.0 : static_cast<double>(o.vocab_size() * o.n_embd());
  const double n = static_cast<double>(count_parameters(o)) - lookup;
  // LoRA: frozen weights take no weight-gradient product, 4 FLOPs per
  // parameter and token (forward, input gradient) instead of 6.
  const double trainable = o.lora_rank() > 0 ? static_cast<double>(count_llama_lora_parameters(o)) : n;
  return 4.0 * n + 2.0 * trainable + 12.0 * o.n_layer() * o.n_head() * o.head_size() * o.block_size();
}

}  // namespace strata::recipes
