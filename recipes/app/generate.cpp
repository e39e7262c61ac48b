#include "strata/recipes/app/generate.h"

#include "strata/core/deferred_init.h"
#include "strata/recipes/app/run_checkpoint.h"
#include "strata/recipes/app/run_checks.h"
#include "strata/recipes/app/small_cli.h"

#include "strata/recipes/data/prompt_style.h"
#include "strata/recipes/data/token_cache.h"
#include "strata/recipes/data/tokenizer/tokenizer.h"

#include <boost/program_options.hpp>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

namespace strata::recipes {

namespace {

namespace fs = std::filesystem;
namespace po = boost::program_options;

struct GenerateOptions {
  std::string model, adapter, prompt, prompt_file, prompt_ids, tokenizer, stop, device = "cpu", chat;
  int64_t max_new_tokens = 64, top_k = 0;
  double temperature = 0.8, top_p = 1.0;
  uint64_t seed = 1234;
  bool ids = false;
};

/// config.json's (and generation_config.json's) eos_token_id, one or a list.
std::set<int64_t> model_eos(const std::string& dir) {
  std::set<int64_t> out;
  for (const char* name : {"generation_config.json", "config.json"}) {
    std::ifstream in(fs::path(dir) / name);
    if (!in) continue;
    try {
      const auto j = nlohmann::json::parse(in);
      if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) continue;
      if (j["eos_token_id"].is_array()) {
        for (const auto& e : j["eos_token_id"]) out.insert(e.get<int64_t>());
      } else {
        out.insert(j["eos_token_id"].get<int64_t>());
      }
      if (!out.empty()) return out;
    } catch (const nlohmann::json::exception&) {
      continue;  // the family's own reader names a broken config.json
    }
  }
  return out;
}

/// Where the model comes from: a model directory a family reads, or a
/// strata-gpt run's checkpoint (its config.ini gives the model).
struct ModelSource {
  std::optional<RunCheckpoint> run;
  std::string directory;  ///< the model directory; a run's --init-from directory ("": a preset)
  std::string tokenizer;  ///< --tokenizer, else the directory's, or the run's
};

ModelSource model_source(const GenerateOptions& o, const StrategyRegistry& strategies, const ModelRegistry& models) {
  ModelSource s;
  if (is_run_checkpoint(o.model)) {
    TORCH_CHECK_VALUE(o.adapter.empty(), "--adapter '", o.adapter, "' applies to a model directory; '", o.model,
                      "' is a strata-gpt run, whose checkpoint holds its adapters");
    s.run = run_checkpoint(o.model, "", strategies, models);
    s.directory = s.run->model->source_directory();
    const std::string& t = s.run->config.tokenizer;
    s.tokenizer = !t.empty() && t != "none" ? t : s.directory;
  } else {
    TORCH_CHECK_VALUE(models.recognizing(o.model) != nullptr, "model '", o.model,
                      "' is no model directory a registered family reads (a transformers Llama, Mistral or Qwen "
                      "directory: config.json and model.safetensors) and no strata-gpt run (an output directory "
                      "with checkpoints/, or a checkpoints/step-N directory)");
    s.directory = s.tokenizer = o.model;
  }
  if (!o.tokenizer.empty()) s.tokenizer = o.tokenizer;
  return s;
}

/// The model for `length` tokens, deferred, its parameters from the
/// directory (and --adapter) or the run's checkpoint.
std::unique_ptr<TrainingModule> build_model(const ModelSource& s, const GenerateOptions& o, int64_t length,
                                            const ModelRegistry& models, ModelPtr& model) {
  if (s.run) {
    // The run's model; computed positions (RoPE) extended to the length asked
    // for, learned ones (GPT's) as trained, which then bound the length.
    RunCheckpoint run = *s.run;
    run.model = models.resolve(model_request(run.config, run.vocab_size, run.block_size));
    if (!run.model->positions_learned() && length > run.block_size)
      run.model = models.resolve(model_request(run.config, run.vocab_size, length));
    model = run.model;
    return model->build(/*deferred=*/true, weights_in_memory(run_checkpoint_tensors(run)));
  }
  ModelRequest request;
  request.init_from = o.model;
  request.init_adapter = o.adapter;
  request.vocab_size = 1;
  request.block_size = length;
  model = models.resolve(request);
  return model->build(/*deferred=*/true, model->read_weights(o.model));
}

/// The next token from `logits` [vocab] (fp32): greedy, or sampled.
int64_t next_token(torch::Tensor logits, const GenerateOptions& o, torch::Generator& gen) {
  if (o.temperature <= 0.0) return logits.argmax().item<int64_t>();
  logits = logits / o.temperature;
  if (o.top_k > 0 && o.top_k < logits.size(0)) {
    const auto kth = std::get<0>(logits.topk(o.top_k)).min();
    logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
  }
  auto probs = torch::softmax(logits, 0);
  if (o.top_p < 1.0) {
    // The smallest set of most likely tokens whose probability reaches top_p.
    auto [sorted, order] = probs.sort(0, /*descending=*/true);
    const auto before = sorted.cumsum(0) - sorted;
    sorted = sorted.masked_fill(before >= o.top_p, 0.0);
    probs = torch::zeros_like(probs).scatter(0, order, sorted);
  }
  return torch::multinomial(probs, 1, false, gen).item<int64_t>();
}

/// The prompt's ids: --prompt-ids as given, or the text (--prompt,
/// --prompt-file; with --chat as a user turn) through `tok`.
std::vector<int32_t> prompt_ids(const GenerateOptions& o, const Tokenizer* tok, const std::string& tokenizer_path) {
  if (!o.prompt_ids.empty()) {
    TORCH_CHECK_VALUE(o.chat.empty(), "--chat applies to --prompt or --prompt-file, not --prompt-ids");
    return parse_token_ids(o.prompt_ids, "--prompt-ids: ");
  }
  std::string text = o.prompt;
  if (!o.prompt_file.empty()) {
    std::ifstream in(o.prompt_file, std::ios::binary);
    TORCH_CHECK_VALUE(in.good(), "--prompt-file '", o.prompt_file, "' cannot be read");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  bool add_bos = true;
  if (!o.chat.empty()) {
    // The prompt as the user's turn under the model's chat format, the assistant's turn opened.
    const auto style = make_prompt_style(o.chat == "auto" ? prompt_style_for(tokenizer_path) : o.chat);
    text = style->generation_prompt({{"user", text}});
    add_bos = !style->writes_bos();
  }
  return tok->encode(text, add_bos);
}

int generate(const GenerateOptions& o, const StrategyRegistry& strategies, const ModelRegistry& models) {
  TORCH_CHECK_VALUE(int(!o.prompt.empty()) + int(!o.prompt_file.empty()) + int(!o.prompt_ids.empty()) == 1,
                    "give one of --prompt, --prompt-file, --prompt-ids");
  TORCH_CHECK_VALUE(o.prompt_ids.empty() || !parse_token_ids(o.prompt_ids, "--prompt-ids: ").empty(),
                    "--prompt-ids is empty");
  TORCH_CHECK_VALUE(o.max_new_tokens > 0, "--max-new-tokens ", o.max_new_tokens, " must be > 0");
  TORCH_CHECK_VALUE(o.top_p > 0.0 && o.top_p <= 1.0, "--top-p ", o.top_p, " must be in (0, 1]");
  const ModelSource source = model_source(o, strategies, models);
  const std::string& tokenizer_path = source.tokenizer;
  // A text prompt needs the tokenizer; ids need it only to show text (without one: ids only).
  std::error_code ec;
  const auto tokenizer = tokenizer_path.empty() ? std::nullopt : tokenizer_file(tokenizer_path);
  const bool has_tokenizer = tokenizer && fs::is_regular_file(*tokenizer, ec);
  TORCH_CHECK_VALUE(has_tokenizer || !o.prompt_ids.empty(), "model '", o.model,
                    "' has no tokenizer.json or tokenizer.model for a text prompt; give --tokenizer PATH, or the "
                    "prompt as --prompt-ids");
  const auto tok = has_tokenizer ? load_tokenizer(tokenizer_path) : nullptr;
  const std::vector<int32_t> prompt = prompt_ids(o, tok.get(), tokenizer_path);
  const torch::Device device(o.device);
  ModelPtr model;
  const int64_t length = int64_t(prompt.size()) + o.max_new_tokens;
  auto module = build_model(source, o, length, models, model);
  TORCH_CHECK_VALUE(!model->positions_learned() || length <= model->shape().block_size, "the prompt's ",
                    prompt.size(), " tokens and --max-new-tokens ", o.max_new_tokens, " exceed the model's context of ",
                    model->shape().block_size, " positions (learned, so no more)");
  materialize_parameters(*module, device);
  module->module().eval();
  auto decoder = model->decoder(*module);
  TORCH_CHECK_VALUE(decoder != nullptr, "model family '", model->family(), "' does not generate");
  std::set<int64_t> eos = source.directory.empty() ? std::set<int64_t>{} : model_eos(source.directory);
  if (eos.empty() && tok) eos.insert(tokenizer_eos_id(*tok, tokenizer_path));

  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  torch::Generator generator(gen);
  std::vector<int32_t> made;
  std::string shown;
  const auto start = std::chrono::steady_clock::now();
  auto logits = decoder->feed(torch::tensor(std::vector<int64_t>(prompt.begin(), prompt.end())).view({1, -1}).to(device));
  const auto first = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    const int64_t next = next_token(logits[0][-1].to(torch::kCPU, torch::kFloat32), o, generator);
    made.push_back(int32_t(next));
    if (eos.count(next)) break;
    if (!o.ids && tok) {
      // Stream what is whole: a character split over tokens waits for its rest.
      const std::string text = tok->decode(made, /*skip_special_tokens=*/true);
      const bool partial = text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0;
      if (!partial && text.size() > shown.size()) {
        std::cout << text.substr(shown.size()) << std::flush;
        shown = text;
      }
      if (!o.stop.empty() && text.find(o.stop) != std::string::npos) break;
    }
    if (i + 1 < o.max_new_tokens) logits = decoder->feed(torch::tensor({next}).view({1, 1}).to(device));
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double prefill = std::chrono::duration<double>(first - start).count();
  if (o.ids) {
    for (size_t i = 0; i < made.size(); ++i) std::cout << (i ? " " : "") << made[i];
  }
  std::cout << std::endl;
  std::cerr << "prompt " << prompt.size() << " tokens in " << prefill << " s; " << made.size() << " new tokens in "
            << total - prefill << " s: " << double(made.size()) / std::max(total - prefill, 1e-9)
            << " tokens/s (KV cache, " << o.device << ")" << std::endl;
  return 0;
}

}  // namespace

int run_generate(int argc, char** argv, const StrategyRegistry& strategies, const ModelRegistry& models) {
  GenerateOptions o;
  po::options_description desc("strata-generate MODEL --prompt TEXT: text from a model directory; exit 2 on bad input");
  desc.add_options()("help,h", "show this help")("model", po::value(&o.model)->required(),
                                                  "a model directory (transformers' format), or a strata-gpt "
                                                  "output or checkpoint directory")(
      "adapter", po::value(&o.adapter), "a PEFT LoRA adapter directory for MODEL")(
      "prompt", po::value(&o.prompt), "the prompt")("prompt-file", po::value(&o.prompt_file), "the prompt, from a file")(
      "prompt-ids", po::value(&o.prompt_ids), "the prompt as token ids (\"1 2 3\")")(
      "tokenizer", po::value(&o.tokenizer), "a tokenizer.json or directory (default: MODEL's)")(
      "max-new-tokens", po::value(&o.max_new_tokens)->default_value(o.max_new_tokens), "tokens to make at most")(
      "temperature", po::value(&o.temperature)->default_value(o.temperature), "0: greedy")(
      "top-k", po::value(&o.top_k)->default_value(o.top_k), "sample from the k most likely (0: all)")(
      "top-p", po::value(&o.top_p)->default_value(o.top_p), "sample from the most likely tokens whose probability reaches p")(
      "seed", po::value(&o.seed)->default_value(o.seed), "the sampler's seed")(
      "stop", po::value(&o.stop), "stop once the text contains this")(
      "ids", po::bool_switch(&o.ids), "print the new tokens' ids on one line instead of the text")(
      "chat", po::value(&o.chat)->implicit_value("auto"),
      "the prompt as a user turn in a chat format: auto (the model's) or a prompt style (docs/data.md)")(
      "device", po::value(&o.device)->default_value(o.device), "cpu or cuda");
  return run_small_cli(argc, argv, desc, "model", [&] { return generate(o, strategies, models); });
}

}  // namespace strata::recipes
