#include "tests/fuzz/fuzz_targets.h"

#include "strata/recipes/app/model_keys.h"
#include "strata/recipes/config/cli.h"
#include "strata/recipes/data/data.h"
#include "strata/recipes/data/instruct.h"
#include "strata/recipes/data/tokenizer/tokenizer.h"
#include "strata/recipes/io/safetensors.h"
#include "strata/recipes/models/gpt/interop.h"
#include "strata/recipes/models/llama/hf_checkpoint.h"
#include "strata/recipes/models/llama/hf_config.h"
#include "strata/recipes/models/llama/peft.h"
#include "strata/recipes/models/spec.h"
#include "strata/strategies/registry.h"
#include "strata/trainer/checkpoint.h"
#include "strata/trainer/checkpoint_format.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <stdlib.h>

#include <filesystem>
#include <map>
#include <fstream>
#include <typeinfo>

namespace strata::fuzz {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- the shared pieces -------------------------------------------------------------------------

/// What strata-gpt parses --config with: the built-in strategies and models.
/// Built once per process (a registry is read-only once made).
const StrategyRegistry& strategies() {
  static const StrategyRegistry registry = [] {
    StrategyRegistry r;
    register_builtin_strategies(r);
    return r;
  }();
  return registry;
}

const recipes::ModelKeys& model_keys() {
  static const recipes::ModelKeys keys = [] {
    recipes::ModelRegistry models;
    recipes::register_builtin_models(models);
    return recipes::cli_keys(models);
  }();
  return keys;
}

/// strata-gpt's --config FILE: parse_run_config never throws; a bad file is
/// exit code 2 with a one-line message.
Outcome parse_config(std::string_view input, const Workspace& ws, const std::string& name) {
  const std::string path = ws.write(name, input);
  try {
    const auto result = recipes::parse_run_config({"strata-gpt", "--config", path}, model_keys(), strategies());
    if (result.config) return {};
    if (result.exit_code != 2) return {"exit code " + std::to_string(result.exit_code) + " for a config, not 2", ""};
    if (result.message.find('\n') != std::string::npos) return {"a message of several lines: " + result.message, ""};
    return {std::nullopt, result.message};
  } catch (const std::exception& e) {
    return {std::string("parse_run_config threw ") + typeid(e).name() + ": " + e.what(), ""};
  }
}

/// A name the checkpoint target may write a data file under: inside the workspace.
bool plain_name(const std::string& name) {
  return !name.empty() && name.size() < 128 && name != "." && name != ".." &&
         name.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

/// metadata.json's text with its crc32 made right for its body, and each data
/// file's block checksums made right for its bytes in `files`; "" when it is no JSON object
/// with a body. So that mutations reach past the checksums, which a fuzzer
/// could not forge.
std::string with_right_checksums(std::string_view metadata, const std::map<std::string, std::string_view>& files) {
  json doc = json::parse(metadata, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("body")) return "";
  json& body = doc["body"];
  if (body.is_object() && body.contains("files") && body["files"].is_object()) {
    for (auto& [name, record] : body["files"].items()) {
      if (!record.is_object() || !record.contains("crc32") || !record["crc32"].is_array() || !files.count(name)) {
        continue;
      }
      const std::string_view data = files.at(name);
      json crcs = json::array();
      for (size_t at = 0; at < data.size(); at += checkpoint_detail::kBlockBytes) {
        const size_t n = std::min<size_t>(data.size() - at, checkpoint_detail::kBlockBytes);
        crcs.push_back(checkpoint_detail::crc_of(data.data() + at, n));
      }
      record["crc32"] = crcs;
    }
  }
  const std::string canonical = body.dump();
  doc["crc32"] = checkpoint_detail::crc_of(canonical.data(), canonical.size());
  return doc.dump(1);
}

/// Everything a checkpoint's reader does without a strategy, on `dir`.
Outcome read_checkpoint(const std::string& dir) {
  try {
    (void)checkpoint_incomplete_reason(dir);  // answers; never throws
  } catch (const std::exception& e) {
    return {std::string("checkpoint_incomplete_reason threw ") + typeid(e).name() + ": " + e.what(), ""};
  }
  return read_or_refused(dir, [&] {
    (void)read_checkpoint_meta(dir);
    (void)read_checkpoint_tensors(dir, "");
  });
}

// ---- the targets --------------------------------------------------------------------------------

Outcome safetensors(std::string_view input, const Workspace& ws) {
  const std::string path = ws.write("model.safetensors", input);
  return read_or_refused(path, [&] {
    for (const auto& [name, entry] : recipes::read_safetensors_header(path)) {
      const int64_t n = std::min<int64_t>(entry.numel(), 16);
      recipes::read_safetensors_range(entry, 0, n, torch::empty({n}));
    }
    (void)recipes::read_safetensors(path);
  });
}

Outcome pickle(std::string_view input, const Workspace& ws) {
  const std::string path = ws.write("ckpt.pt", input);
  return read_or_refused(path, [&] { (void)recipes::read_weights(path); });
}

/// The data files metadata.json names, from `data`: one after another in
/// name order, each as long as its record's size says, the last the rest.
std::map<std::string, std::string_view> split_data(const json& doc, std::string_view data) {
  std::map<std::string, std::string_view> files;
  if (!doc.is_object() || !doc.contains("body") || !doc["body"].is_object() || !doc["body"].contains("files") ||
      !doc["body"]["files"].is_object()) {
    return files;
  }
  const json& records = doc["body"]["files"];
  size_t at = 0, left = records.size();
  for (const auto& [name, record] : records.items()) {
    --left;
    if (!plain_name(name)) continue;
    const bool sized = record.is_object() && record.contains("size") && record["size"].is_number_unsigned();
    const size_t n = left == 0 || !sized ? data.size() - at : std::min<size_t>(record["size"].get<size_t>(), data.size() - at);
    files[name] = data.substr(at, n);
    at += n;
  }
  return files;
}

/// The input is metadata.json, then (after a NUL byte, which JSON text never
/// holds) the bytes of the data files it names (split_data).
Outcome checkpoint(std::string_view input, const Workspace& ws) {
  const size_t split = input.find('\0');
  const std::string_view metadata = input.substr(0, split);
  const std::string_view data = split == std::string_view::npos ? std::string_view() : input.substr(split + 1);
  const std::string dir = ws.fresh_dir("checkpoint");
  const json doc = json::parse(metadata, nullptr, /*allow_exceptions=*/false);
  const auto files = split_data(doc, data);
  for (const auto& [name, bytes] : files) ws.write("checkpoint/" + name, bytes);
  ws.write("checkpoint/metadata.json", metadata);
  const Outcome as_is = read_checkpoint(dir);
  const std::string fixed = with_right_checksums(metadata, files);
  if (fixed.empty() || as_is.broken) return as_is;
  ws.write("checkpoint/metadata.json", fixed);
  return as_is | read_checkpoint(dir);
}

Outcome config_ini(std::string_view input, const Workspace& ws) { return parse_config(input, ws, "config.ini"); }
Outcome deepspeed_json(std::string_view input, const Workspace& ws) { return parse_config(input, ws, "ds.json"); }
Outcome accelerate_yaml(std::string_view input, const Workspace& ws) {
  return parse_config(input, ws, "accelerate.yaml");
}

/// nanoGPT's prepare.py output: the input as both train.bin and val.bin.
Outcome nanogpt_bin(std::string_view input, const Workspace& ws) {
  const std::string dir = ws.fresh_dir("bin");
  ws.write("bin/train.bin", input);
  ws.write("bin/val.bin", input);
  return read_or_refused(dir, [&] {
    const auto data = recipes::make_data(dir, 8, 50304, 0);
    (void)data->train_batch(0, 2, {});
    (void)data->val_batch(0, 2, {});
  });
}

Outcome hf_config(std::string_view input, const Workspace& ws) {
  const std::string dir = ws.fresh_dir("hf");
  const std::string path = ws.write("hf/config.json", input);
  return read_or_refused(path, [&] {
    const auto options = recipes::read_hf_llama_options(dir);
    (void)recipes::llama_hf_config(options, "float32");
  });
}

/// The input as model.safetensors.index.json beside one shard.
Outcome hf_index(std::string_view input, const Workspace& ws) {
  const std::string dir = ws.fresh_dir("index");
  recipes::write_safetensors(dir + "/model-00001-of-00001.safetensors",
                             {{"model.embed_tokens.weight", torch::ones({4, 4})}});
  ws.write("index/model.safetensors.index.json", input);
  // An error names the index or the shard it is about: the directory, either way.
  return read_or_refused(dir, [&] { (void)recipes::read_hf_entries(dir); });
}

/// A tokenizer is read, then encodes and decodes a text with what tokenizers meet.
Outcome tokenize(const std::string& path) {
  return read_or_refused(path, [&] {
    const auto tok = recipes::load_tokenizer(path);
    const auto ids = tok->encode("Hello, w\xc3\xb6rld!  123\n\t\xe6\x97\xa5\xe6\x9c\xac <|endoftext|> \xf0\x9f\x99\x82 ", true);
    (void)tok->decode(ids);
    (void)tok->decode(ids, /*skip_special_tokens=*/true);
  });
}

Outcome tokenizer_json(std::string_view input, const Workspace& ws) {
  return tokenize(ws.write("tokenizer.json", input));
}

Outcome tiktoken(std::string_view input, const Workspace& ws) { return tokenize(ws.write("tokenizer.model", input)); }

/// Instruction data as JSONL (a record a line) and as JSON (a list: Alpaca's).
Outcome instruct(std::string_view input, const Workspace& ws) {
  const std::string jsonl = ws.write("data.jsonl", input);
  const Outcome as_jsonl = read_or_refused(jsonl, [&] { (void)recipes::read_instruct_records(jsonl); });
  const std::string json_path = ws.write("data.json", input);
  return as_jsonl | read_or_refused(json_path, [&] { (void)recipes::read_instruct_records(json_path); });
}

/// The input as adapter_config.json beside a one-layer adapter_model.safetensors.
Outcome peft(std::string_view input, const Workspace& ws) {
  const std::string dir = ws.fresh_dir("peft");
  const std::string layer = "base_model.model.model.layers.0.self_attn.q_proj.";
  recipes::write_safetensors(dir + "/adapter_model.safetensors",
                             {{layer + "lora_A.weight", torch::ones({2, 8})}, {layer + "lora_B.weight", torch::zeros({8, 2})}});
  ws.write("peft/adapter_config.json", input);
  return read_or_refused(dir, [&] { (void)recipes::read_peft_lora(dir); });
}

}  // namespace

Workspace::Workspace() {
  std::string pattern = (fs::temp_directory_path() / "strata-fuzz-XXXXXX").string();
  TORCH_CHECK(::mkdtemp(pattern.data()) != nullptr, "cannot make a directory from ", pattern);
  dir_ = pattern;
}

Workspace::~Workspace() {
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

std::string Workspace::write(const std::string& name, std::string_view bytes) const {
  const fs::path path = fs::path(dir_) / name;
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  TORCH_CHECK(out.good(), "cannot write ", path.string());
  return path.string();
}

std::string Workspace::fresh_dir(const std::string& name) const {
  const fs::path path = fs::path(dir_) / name;
  fs::remove_all(path);
  fs::create_directories(path);
  return path.string();
}

Outcome Outcome::operator|(const Outcome& other) const {
  if (broken) return *this;
  if (other.broken || refused.empty()) return other.broken ? other : *this;
  return other;
}

Outcome read_or_refused(const std::string& file, const std::function<void()>& parse) {
  try {
    parse();
    return {};
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    if (message.find('\n') != std::string::npos) return {"a message of several lines: " + message, ""};
    if (message.find(file) == std::string::npos) return {"a message that does not name " + file + ": " + message, ""};
    return {std::nullopt, message};
  } catch (const std::exception& e) {
    return {std::string("threw ") + typeid(e).name() + " (not c10::Error): " + e.what(), ""};
  } catch (...) {
    return {"threw something that is no std::exception", ""};
  }
}

const std::vector<Target>& targets() {
  static const std::vector<Target> all{
      {"safetensors", "model.safetensors: header, every tensor (recipes/io/safetensors.h)", safetensors},
      {"pickle", "ckpt.pt: torch.save / pickle, through LibTorch's unpickler (recipes/models/gpt/interop.h)", pickle},
      {"checkpoint", "metadata.json, NUL, data file bytes: a strata checkpoint (trainer/checkpoint.h)", checkpoint},
      {"config_ini", "strata-gpt --config config.ini (recipes/config/cli.h)", config_ini},
      {"deepspeed_json", "strata-gpt --config ds.json: DeepSpeed's JSON (recipes/config/foreign_config.h)",
       deepspeed_json},
      {"accelerate_yaml", "strata-gpt --config accelerate.yaml: Accelerate's YAML", accelerate_yaml},
      {"nanogpt_bin", "train.bin / val.bin: nanoGPT's uint16 tokens (recipes/data/data.h)", nanogpt_bin},
      {"hf_config", "a transformers directory's config.json (recipes/models/llama/hf_checkpoint.h)", hf_config},
      {"hf_index", "model.safetensors.index.json beside its shard", hf_index},
      {"tokenizer_json", "tokenizer.json, then encode and decode (recipes/data/tokenizer/tokenizer.h)",
       tokenizer_json},
      {"tiktoken", "a tiktoken BPE file (Llama 3's tokenizer.model), then encode and decode", tiktoken},
      {"instruct", "instruction data, .jsonl and .json (recipes/data/instruct.h)", instruct},
      {"peft", "a PEFT adapter's adapter_config.json (recipes/models/llama/peft.h)", peft},
  };
  return all;
}

const Target* find_target(const std::string& name) {
  for (const auto& t : targets()) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace strata::fuzz
