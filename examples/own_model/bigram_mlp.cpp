#include "bigram_mlp.h"

#include <strata/core/deferred_init.h>
#include <strata/recipes/models/lm.h>

#include <ATen/CPUGeneratorImpl.h>

namespace own_model {
namespace {

/// x + fc2(gelu(fc1(x))): a residual MLP over each position.
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(int64_t c) {
    fc1 = register_module("fc1", torch::nn::Linear(c, 4 * c));
    fc2 = register_module("fc2", torch::nn::Linear(4 * c, c));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(torch::gelu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

int64_t block_parameters(int64_t c) { return 8 * c * c + 5 * c; }

}  // namespace

BigramMlp::BigramMlp(const BigramMlpOptions& o, bool deferred)
    : options_(o), seed_(at::detail::getDefaultCPUGenerator().current_seed()),
      root_(std::make_shared<torch::nn::Module>()) {
  embed_ = root_->register_module("embed", torch::nn::Embedding(o.vocab_size(), o.n_embd()));
  auto blocks = root_->register_module("blocks", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < o.n_layer(); ++i) {
    blocks_.push_back(blocks->register_module(std::to_string(i), Block(o.n_embd())));
  }
  head_ = root_->register_module("head", torch::nn::Linear(o.n_embd(), o.vocab_size()));
  if (deferred) {
    strata::defer_parameters(*root_);  // meta tensors until a strategy's setup
    return;
  }
  for (const auto& item : root_->named_parameters()) init_parameter(item.key(), item.value());
}

void BigramMlp::init_parameter(const std::string& name, const torch::Tensor& param) {
  // Depends on the name and the seed only: any strategy, any unit order.
  torch::NoGradGuard no_grad;
  if (param.dim() == 1) {
    param.zero_();
  } else {
    strata::normal_init(param, 0.0, 0.02, strata::parameter_generator(seed_, name));
  }
}

torch::Tensor BigramMlp::forward(const torch::Tensor& idx) {
  auto x = embed_->forward(idx);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    // Through the unit seam: strategies wrap each block (FSDP, checkpointing).
    auto* block = blocks_[i]->as<BlockImpl>();
    x = run_unit(static_cast<int64_t>(i), x, [block](const torch::Tensor& t) { return block->forward(t); });
  }
  return head_->forward(x);
}

torch::Tensor BigramMlp::training_step(const strata::Batch& batch) {
  return strata::recipes::lm_loss(forward(batch.input), batch.target);
}

strata::ValidationStep BigramMlp::validation_step(const strata::Batch& batch) {
  return strata::recipes::lm_validation(forward(batch.input), batch);
}

double BigramMlp::flops_per_token() const { return BigramMlpConfig(options_).flops_per_token(); }

BigramMlpConfig::BigramMlpConfig(BigramMlpOptions options) : options_(std::move(options)) {
  TORCH_CHECK_VALUE(options_.n_layer() > 0 && options_.n_embd() > 0, "bigram-mlp needs n_layer > 0 and n_embd > 0, got ",
                    options_.n_layer(), " and ", options_.n_embd());
}

strata::recipes::ModelShape BigramMlpConfig::shape() const {
  const auto& o = options_;
  return {.layers = o.n_layer(), .width = o.n_embd(), .vocab_size = o.vocab_size(), .block_size = o.block_size()};
}

std::map<std::string, double> BigramMlpConfig::resolved_numbers() const {
  return {{"n-layer", double(options_.n_layer())}, {"n-embd", double(options_.n_embd())}};
}

strata::recipes::ModelPtr BigramMlpConfig::with_layers(int64_t n_layer) const {
  auto o = options_;
  return std::make_shared<BigramMlpConfig>(o.n_layer(n_layer));
}

std::unique_ptr<strata::TrainingModule> BigramMlpConfig::build(bool deferred,
                                                               strata::recipes::ParameterSourcePtr source) const {
  if (!source) return std::make_unique<BigramMlp>(options_, deferred);
  return std::make_unique<strata::recipes::SourcedModule<BigramMlp>>(std::move(source), options_, deferred);
}

int64_t BigramMlpConfig::parameters() const {
  const auto& o = options_;
  return 2 * o.vocab_size() * o.n_embd() + o.vocab_size() + o.n_layer() * block_parameters(o.n_embd());
}

strata::ModelSize BigramMlpConfig::size(int) const {
  strata::ModelSize m;
  m.params = m.trainable = parameters();
  m.units = options_.n_layer();
  m.unit_params = m.unit_trainable = block_parameters(options_.n_embd());
  return m;
}

double BigramMlpConfig::flops_per_token() const {
  // 6 per weight of every product (the embedding is a lookup).
  const auto& o = options_;
  return 6.0 * double(o.n_layer() * 8 * o.n_embd() * o.n_embd() + o.n_embd() * o.vocab_size());
}

std::vector<strata::recipes::GemmShape> BigramMlpConfig::step_gemms(int64_t tokens) const {
  const int64_t c = options_.n_embd(), l = options_.n_layer();
  return strata::recipes::linear_step_gemms({{c, 4 * c, l}, {4 * c, c, l}, {c, options_.vocab_size(), 1}}, tokens);
}

strata::recipes::ActivationProfile BigramMlpConfig::activation_formula(int64_t micro_batch, strata::Precision precision,
                                                                       const std::string&) const {
  // Per block the input, fc1's output and GELU's (1 + 4 + 4 floats per
  // width and position); the base: the logits, their softmax and gradient.
  const double bt = double(micro_batch) * double(options_.block_size()), c = double(options_.n_embd());
  const double bytes = strata::compute_dtype(precision) ? 2.0 : 4.0;
  strata::recipes::ActivationProfile a;
  a.per_block = static_cast<int64_t>(9.0 * c * bt * bytes);
  a.base = static_cast<int64_t>(3.0 * double(options_.vocab_size()) * bt * 4.0 + 2.0 * c * bt * 4.0);
  a.checkpointed_per_block = static_cast<int64_t>(c * bt * bytes);
  a.checkpointed_base = std::max(a.base, 2 * a.per_block);
  return a;
}

strata::recipes::ModelSpec bigram_mlp_spec() {
  strata::recipes::ModelSpec spec("bigram-mlp", "a bigram MLP language model (examples/own_model)");
  spec.presets({"bigram-mlp-small", "bigram-mlp-wide"})
      // Its own keys on strata-gpt's command line, --config and config.ini
      // (0: the preset's). n-layer is also the GPT's and the Llama's: one
      // key, one kind (an integer), each family's help.
      .options({strata::recipes::ModelOption::integer("n-layer", 0, "hidden layers of the MLP (0: the preset's)")
                    .at_least(0),
                strata::recipes::ModelOption::integer("n-embd", 0, "the MLP's width (0: the preset's)").at_least(0)})
      .factory([](const strata::recipes::ModelRequest& r) -> strata::recipes::ModelPtr {
        auto o = BigramMlpOptions().n_embd(r.preset == "bigram-mlp-wide" ? 256 : 64);
        o.n_layer(r.integer("n-layer", o.n_layer())).n_embd(r.integer("n-embd", o.n_embd()));
        return std::make_shared<BigramMlpConfig>(o.vocab_size(r.vocab_size).block_size(r.block_size));
      });
  return spec;
}

}  // namespace own_model
