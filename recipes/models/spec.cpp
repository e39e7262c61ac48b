#include "strata/recipes/models/spec.h"

#include "strata/recipes/models/gpt/spec.h"
#include "strata/recipes/models/llama/spec.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <map>

namespace strata::recipes {

std::string ModelConfig::tensor_parallel_problem(int size, bool) const {
  if (size <= 1) return "";
  return "tensor-parallel size " + std::to_string(size) + ": the " + family() +
         " family has no tensor-parallel plan (it runs on one rank of a group)";
}

ParameterSourcePtr ModelConfig::read_weights(const std::string& path) const {
  TORCH_CHECK_VALUE(false, "--init-from '", path, "': the ", family(), " family reads no weights");
}

void ModelConfig::write_weights(const std::string& path, const NamedTensors&, const std::string& format) const {
  TORCH_CHECK_VALUE(false, export_problem(path, format));
}

std::string ModelConfig::export_problem(const std::string& path, const std::string& format) const {
  return "the " + family() + " family writes no weights (asked for format '" + format + "' at '" + path +
         "'); its checkpoints hold them";
}

int64_t ActivationProfile::total(int64_t n_layer, int64_t checkpoint_every) const {
  if (checkpoint_every <= 0) return base + n_layer * per_block;
  // Checkpointed blocks keep their input; one of them at a time recomputes
  // its forward in backward (in checkpointed_base). Blocks left whole keep
  // their activations.
  const int64_t checkpointed = ceil_div(n_layer, checkpoint_every);
  return checkpointed_base + checkpointed * checkpointed_per_block + (n_layer - checkpointed) * per_block;
}

namespace {

const std::string* find_option(const ModelRequest& r, const std::string& key) {
  const auto it = r.options.find(key);
  return it == r.options.end() ? nullptr : &it->second;
}

[[noreturn]] void bad_option(const std::string& key, const std::string& text, const std::string& expected) {
  TORCH_CHECK_VALUE(false, "invalid value '", text, "' for --", key, ": expected ", expected);
}

}  // namespace

int64_t ModelRequest::integer(const std::string& key, int64_t fallback) const {
  const std::string* text = find_option(*this, key);
  if (text == nullptr) return fallback;
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(*text, &used);
  } catch (const std::exception&) {
    bad_option(key, *text, "an integer");
  }
  if (used != text->size()) bad_option(key, *text, "an integer");
  return value;
}

double ModelRequest::real(const std::string& key, double fallback) const {
  const std::string* text = find_option(*this, key);
  if (text == nullptr) return fallback;
  double value = 0.0;
  if (!parse_real_text(*text, value).empty()) bad_option(key, *text, "a finite number");
  return value;
}

bool ModelRequest::boolean(const std::string& key, bool fallback) const {
  const std::string* text = find_option(*this, key);
  if (text == nullptr) return fallback;
  bool value = false;
  if (!parse_bool_text(*text, value).empty()) bad_option(key, *text, "true or false");
  return value;
}

std::string ModelRequest::text(const std::string& key, const std::string& fallback) const {
  const std::string* text = find_option(*this, key);
  return text == nullptr ? fallback : *text;
}

namespace {

/// Every preset `bench` names ("" left out).
std::vector<std::string> bench_presets(const BenchWorkloads& bench) {
  std::vector<std::string> out = {bench.tiny.preset, bench.small.preset, bench.medium.preset, bench.peer.preset};
  out.insert(out.end(), bench.scale.begin(), bench.scale.end());
  out.insert(out.end(), bench.planner.begin(), bench.planner.end());
  out.insert(out.end(), bench.checkpoint.begin(), bench.checkpoint.end());
  for (const auto& c : bench.planner_held_out) out.push_back(c.preset);
  std::erase(out, std::string());
  return out;
}

}  // namespace

void ModelRegistry::add(ModelSpec spec) {
  TORCH_CHECK_VALUE(!spec.name().empty(), "a model spec needs a name");
  for (const auto& s : specs_) {
    TORCH_CHECK_VALUE(s.name() != spec.name(), "model family '", spec.name(), "' is already registered");
  }
  TORCH_CHECK_VALUE(spec.factory() != nullptr, "model family '", spec.name(), "' has no factory");
  TORCH_CHECK_VALUE(!spec.presets().empty(), "model family '", spec.name(), "' has no presets");
  for (const auto& preset : spec.presets()) {
    const auto it = presets_.find(preset);
    TORCH_CHECK_VALUE(it == presets_.end(), "preset '", preset, "' of model family '", spec.name(),
                      "' is already family '", it == presets_.end() ? "" : specs_[it->second].name(), "''s");
  }
  TORCH_CHECK_VALUE(spec.default_preset().empty() ||
                        std::find(spec.presets().begin(), spec.presets().end(), spec.default_preset()) !=
                            spec.presets().end(),
                    "model family '", spec.name(), "': default preset '", spec.default_preset(),
                    "' is not one of its presets");
  for (const auto& preset : bench_presets(spec.bench())) {
    // A suite runs the family it was given: its own presets only.
    TORCH_CHECK_VALUE(std::find(spec.presets().begin(), spec.presets().end(), preset) != spec.presets().end(),
                      "model family '", spec.name(), "': bench preset '", preset, "' is not one of its presets");
  }
  for (const auto& option : spec.options()) {
    // One key, one kind: the command line parses it once for every family.
    for (const auto& s : specs_) {
      for (const auto& theirs : s.options()) {
        TORCH_CHECK_VALUE(theirs.key() != option.key() || theirs.kind() == option.kind(), "model family '",
                          spec.name(), "' declares --", option.key(), " as ", option_kind_name(option.kind()),
                          "; family '", s.name(), "' declares it as ", option_kind_name(theirs.kind()));
      }
    }
  }
  for (const auto& preset : spec.presets()) presets_[preset] = specs_.size();
  specs_.push_back(std::move(spec));
}

const ModelSpec& ModelRegistry::spec_of_preset(const std::string& preset) const {
  const auto it = presets_.find(preset);
  TORCH_CHECK_VALUE(it != presets_.end(), "unknown preset '", preset, "'; available: ",
                    c10::Join(", ", preset_names()));
  return specs_[it->second];
}

namespace {

/// `request` with its options checked against `spec`'s declarations (each
/// key declared, each value of its kind and within its rule) and those given
/// at their declared default left out: the default means "the preset's own"
/// (a size of 0) or the family's choice, which the factory keeps.
ModelRequest declared_options(const ModelSpec& spec, const ModelRequest& request) {
  ModelRequest out = request;
  out.options.clear();
  std::vector<std::string> keys;
  for (const auto& option : spec.options()) keys.push_back(option.key());
  for (const auto& [key, text] : request.options) {
    const auto it = std::find_if(spec.options().begin(), spec.options().end(),
                                 [&key = key](const ModelOption& o) { return o.key() == key; });
    TORCH_CHECK_VALUE(it != spec.options().end(), "--", key, " ", text, " does not apply to the ", spec.name(),
                      " family (--preset ", request.preset,
                      "); its options: ", keys.empty() ? std::string("none") : "--" + c10::Join(", --", keys));
    OptionValue value;
    std::string broken = it->parse(text, value);
    if (broken.empty()) broken = it->check(value);
    TORCH_CHECK_VALUE(broken.empty(), "invalid value '", text, "' for --", key, ": ", broken, " (the ",
                      spec.name(), " family)");
    if (value != it->default_value()) out.options[key] = option_text(value);
  }
  return out;
}

}  // namespace

std::vector<ModelOption> decoder_options() {
  return {
      ModelOption::integer("n-layer", 0, "transformer blocks (0: the preset's)").at_least(0),
      ModelOption::integer("n-head", 0, "attention heads (0: the preset's)").at_least(0),
      ModelOption::integer("n-embd", 0, "embedding width (0: the preset's)").at_least(0),
      ModelOption::choice("attention", "fused", {"fused", "sdpa", "naive"},
                          "attention core: fused (strata's tiled CPU kernel, O(B·H·T) kept for backward; on CUDA "
                          "LibTorch's SDPA), sdpa (LibTorch's scaled_dot_product_attention on any device) or naive "
                          "(the reference: B×H×T×T scores)"),
  };
}

std::vector<ModelOption> lora_options(const std::string& targets_help) {
  return {
      ModelOption::integer("lora-rank", 0,
                           "LoRA fine-tuning: adapters of this rank on the --lora-targets Linears, every other "
                           "weight frozen; exports merge them (0: off)")
          .at_least(0),
      ModelOption::real("lora-alpha", 8.0, "LoRA: the adapters' output is scaled by alpha / rank").above(0),
      ModelOption::text("lora-targets", "", targets_help),
  };
}

std::string ModelRegistry::default_preset() const {
  for (const auto& spec : specs_) {
    if (!spec.default_preset().empty()) return spec.default_preset();
  }
  return specs_.empty() ? "" : specs_.front().presets().front();
}

ModelPtr ModelRegistry::resolve(const ModelRequest& request) const {
  const ModelSpec* recognized = request.init_from.empty() ? nullptr : recognizing(request.init_from);
  if (recognized == nullptr && request.preset.empty() && !request.default_preset.empty()) {
    ModelRequest with_default = request;
    with_default.preset = request.default_preset;
    return resolve(with_default);
  }
  TORCH_CHECK_VALUE(recognized != nullptr || !request.preset.empty(), "no --preset given; available: ",
                    c10::Join(", ", preset_names()));
  // Why not both: the preset's shapes would be silently replaced by the directory's.
  TORCH_CHECK_VALUE(recognized == nullptr || request.preset.empty(), "--preset ", request.preset,
                    " and --init-from '", request.init_from, "' (a ", recognized ? recognized->name() : "",
                    " checkpoint directory) both give the model; drop --preset: the directory's config.json gives it");
  const ModelSpec& spec = recognized != nullptr ? *recognized : spec_of_preset(request.preset);
  TORCH_CHECK_VALUE(request.init_adapter.empty() || (recognized != nullptr && spec.reads_adapters()),
                    "--init-adapter '", request.init_adapter, "' needs --init-from a model directory of a family that ",
                    "reads PEFT adapters (", c10::Join(", ", adapter_families()), "); ",
                    recognized == nullptr ? "no --init-from directory was given"
                                          : "the " + spec.name() + " family does not read them");
  ModelPtr model = spec.factory()(declared_options(spec, request));
  TORCH_CHECK(model != nullptr, "model family '", spec.name(), "' built no model for preset ", request.preset);
  return model;
}

std::vector<std::string> ModelRegistry::adapter_families() const {
  std::vector<std::string> names;
  for (const auto& spec : specs_) {
    if (spec.reads_adapters()) names.push_back(spec.name());
  }
  return names;
}

const ModelSpec* ModelRegistry::recognizing(const std::string& path) const {
  for (const auto& spec : specs_) {
    if (spec.recognizes() && spec.recognizes()(path)) return &spec;
  }
  return nullptr;
}

std::vector<std::string> ModelRegistry::preset_names() const {
  std::vector<std::string> names;
  for (const auto& spec : specs_) names.insert(names.end(), spec.presets().begin(), spec.presets().end());
  return names;
}

std::vector<GemmShape> linear_step_gemms(const std::vector<std::tuple<int64_t, int64_t, int64_t>>& linears,
                                         int64_t tokens) {
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> count;
  for (const auto& [in, out, times] : linears) {
    count[{tokens, in, out}] += times;   // forward
    count[{tokens, out, in}] += times;   // the input's gradient
    count[{out, tokens, in}] += times;   // the weight's gradient
  }
  std::vector<GemmShape> shapes;
  for (const auto& [shape, times] : count) {
    shapes.push_back({std::get<0>(shape), std::get<1>(shape), std::get<2>(shape), times});
  }
  return shapes;
}

namespace {

class InMemoryWeights : public ParameterSource {
 public:
  explicit InMemoryWeights(NamedTensors weights) : weights_(std::move(weights)) {}
  bool has(const std::string& name) const override { return weights_.count(name) != 0; }
  void read(const std::string& name, int64_t begin, int64_t end, const torch::Tensor& out) const override {
    const auto it = weights_.find(name);
    TORCH_CHECK(it != weights_.end(), "--init-from: no value for parameter ", name, " (or it was read already)");
    torch::NoGradGuard no_grad;
    out.copy_(it->second.reshape({-1}).narrow(0, begin, end - begin));
    // Setup reads each parameter once: the file's copy is not needed again.
    if (begin == 0 && end == it->second.numel()) weights_.erase(it);
  }

 private:
  mutable NamedTensors weights_;
};

class SafetensorsParameters : public ParameterSource {
 public:
  explicit SafetensorsParameters(std::map<std::string, SafetensorsEntry> entries) : entries_(std::move(entries)) {}
  bool has(const std::string& name) const override { return entries_.count(name) != 0; }
  void read(const std::string& name, int64_t begin, int64_t end, const torch::Tensor& out) const override {
    const auto it = entries_.find(name);
    TORCH_CHECK(it != entries_.end(), "--init-from: no value for parameter ", name);
    torch::NoGradGuard no_grad;
    read_safetensors_range(it->second, begin, end, out);
  }
  bool serves_parts() const override { return true; }

 private:
  std::map<std::string, SafetensorsEntry> entries_;
};

}  // namespace

ParameterSourcePtr weights_in_memory(NamedTensors weights) {
  return std::make_shared<InMemoryWeights>(std::move(weights));
}

ParameterSourcePtr safetensors_parameters(std::map<std::string, SafetensorsEntry> entries) {
  return std::make_shared<SafetensorsParameters>(std::move(entries));
}

std::vector<const ModelSpec*> ModelRegistry::specs() const {
  std::vector<const ModelSpec*> out;
  for (const auto& spec : specs_) out.push_back(&spec);
  return out;
}

const ModelSpec& ModelRegistry::bench_family() const {
  for (const auto& spec : specs_) {
    if (!spec.bench().medium.preset.empty()) return spec;
  }
  std::vector<std::string> names;
  for (const auto& spec : specs_) names.push_back(spec.name());
  C10_THROW_ERROR(ValueError, "no registered model family gives bench workloads (ModelSpec::bench); families: " +
                                  c10::Join(", ", names));
}

void register_builtin_models(ModelRegistry& registry) {
  registry.add(gpt_model_spec());
  registry.add(llama_model_spec());
}

}  // namespace strata::recipes
