#include "strata/recipes/models/llama/hf_config.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <nlohmann/json.hpp>

#include <algorithm>

namespace strata::recipes {
namespace {

using nlohmann::json;

/// Reads config.json's keys with errors that name the file and the key.
class ConfigReader {
 public:
  ConfigReader(const json& config, std::string where) : c_(config), where_(std::move(where)) {}

  bool has(const std::string& key) const { return c_.contains(key) && !c_.at(key).is_null(); }

  int64_t integer(const std::string& key) const {
    TORCH_CHECK_VALUE(has(key), where_, ": '", key, "' is missing; a ", type(), " config needs it");
    TORCH_CHECK_VALUE(c_.at(key).is_number_integer(), where_, ": '", key, "' must be an integer, got ",
                      c_.at(key).dump());
    return c_.at(key).get<int64_t>();
  }
  int64_t integer_or(const std::string& key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }

  double number(const json& from, const std::string& key, const std::string& path) const {
    TORCH_CHECK_VALUE(from.contains(key) && !from.at(key).is_null(), where_, ": '", path, key,
                      "' is missing; a ", type(), " config needs it");
    TORCH_CHECK_VALUE(from.at(key).is_number(), where_, ": '", path, key, "' must be a number, got ",
                      from.at(key).dump());
    return from.at(key).get<double>();
  }
  double number(const std::string& key) const { return number(c_, key, ""); }

  bool boolean_or(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    TORCH_CHECK_VALUE(c_.at(key).is_boolean(), where_, ": '", key, "' must be true or false, got ", c_.at(key).dump());
    return c_.at(key).get<bool>();
  }

  std::string string(const std::string& key) const {
    TORCH_CHECK_VALUE(has(key) && c_.at(key).is_string(), where_, ": '", key, "' is missing or not a string");
    return c_.at(key).get<std::string>();
  }

  /// For messages: the model_type when it is one strata reads (its text comes from the file).
  std::string type() const {
    const auto types = llama_model_types();
    const bool given = has("model_type") && c_.at("model_type").is_string();
    const std::string t = given ? c_.at("model_type").get<std::string>() : "";
    return std::find(types.begin(), types.end(), t) != types.end() ? t : "Llama-family";
  }
  const json& raw() const { return c_; }
  const std::string& where() const { return where_; }

 private:
  const json& c_;
  std::string where_;
};

/// RoPE: transformers 4.x's rope_theta + rope_scaling, or 5.x's
/// rope_parameters (which holds rope_theta and the scaling together).
void read_rope(const ConfigReader& r, LlamaOptions& o) {
  const json& c = r.raw();
  const bool v5 = r.has("rope_parameters");
  const json* scaling = v5 ? &c.at("rope_parameters") : (r.has("rope_scaling") ? &c.at("rope_scaling") : nullptr);
  const std::string path = v5 ? "rope_parameters." : "rope_scaling.";
  o.rope_theta(v5 && c.at("rope_parameters").contains("rope_theta") ? r.number(*scaling, "rope_theta", path)
                                                                     : r.number("rope_theta"));
  if (scaling == nullptr) return;
  TORCH_CHECK_VALUE(scaling->is_object(), r.where(), ": '", path.substr(0, path.size() - 1), "' must be an object, got ",
                    scaling->dump());
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (scaling->contains(key) && scaling->at(key).is_string()) {
      type = scaling->at(key).get<std::string>();
      break;
    }
  }
  RopeScaling s;
  if (type == "default") return;
  TORCH_CHECK_VALUE(type == "linear" || type == "llama3", r.where(), ": ", path, "rope_type ", json(type).dump(),
                    " is not supported; available: default, linear, llama3");
  s.type = type;
  s.factor = r.number(*scaling, "factor", path);
  if (type == "llama3") {
    s.low_freq_factor = r.number(*scaling, "low_freq_factor", path);
    s.high_freq_factor = r.number(*scaling, "high_freq_factor", path);
    s.original_max_position = static_cast<int64_t>(r.number(*scaling, "original_max_position_embeddings", path));
  }
  o.rope_scaling(s);
}

/// Mistral's window applies whenever it is set; Qwen's only with
/// use_sliding_window; Llama has none.
int64_t sliding_window(const ConfigReader& r, const std::string& model_type) {
  if (model_type == "llama") return 0;
  if (model_type != "mistral" && !r.boolean_or("use_sliding_window", false)) return 0;
  return r.integer_or("sliding_window", 0);
}

void refuse_unsupported(const ConfigReader& r) {
  const std::string act = r.has("hidden_act") ? r.string("hidden_act") : "silu";
  TORCH_CHECK_VALUE(act == "silu", r.where(), ": hidden_act '", act, "' is not supported; available: silu");
  if (r.has("attention_dropout")) {
    const double p = r.number("attention_dropout");
    TORCH_CHECK_VALUE(p == 0.0, r.where(), ": attention_dropout ", p, " is not supported; available: 0");
  }
  if (r.has("layer_types")) {
    for (const auto& t : r.raw().at("layer_types")) {
      TORCH_CHECK_VALUE(t == "full_attention", r.where(), ": layer_types holds ", t.dump(),
                        ", which is not supported; available: \"full_attention\"");
    }
  }
  if (r.has("pretraining_tp")) {
    const auto tp = r.integer("pretraining_tp");
    TORCH_CHECK_VALUE(tp == 1, r.where(), ": pretraining_tp ", tp, " is not supported; available: 1");
  }
}

}  // namespace

std::vector<std::string> llama_model_types() { return {"llama", "mistral", "qwen2", "qwen3"}; }

LlamaOptions llama_options_from_hf_config(const std::string& text, const std::string& where, int64_t block_size) {
  json c;
  try {
    c = json::parse(text);
  } catch (const json::exception& e) {
    TORCH_CHECK_VALUE(false, where, ": not valid JSON (", e.what(), ")");
  }
  TORCH_CHECK_VALUE(c.is_object(), where, ": expected a JSON object, got ", std::string(c.type_name()));
  const ConfigReader r(c, where);
  const std::string type = r.string("model_type");
  const auto types = llama_model_types();
  // The value as JSON: quoted, any control byte escaped (the message stays one line).
  TORCH_CHECK_VALUE(std::find(types.begin(), types.end(), type) != types.end(), where, ": model_type ",
                    json(type).dump(), " is not supported; available: ", c10::Join(", ", types));
  refuse_unsupported(r);
  const int64_t heads = r.integer("num_attention_heads"), hidden = r.integer("hidden_size");
  LlamaOptions o(r.integer("num_hidden_layers"), heads, hidden, r.integer("intermediate_size"));
  o.model_type(type)
      .n_kv_head(r.integer_or("num_key_value_heads", heads))
      .head_dim(r.integer_or("head_dim", 0))
      .vocab_size(r.integer("vocab_size"))
      .max_position_embeddings(r.integer("max_position_embeddings"))
      .rms_norm_eps(r.number("rms_norm_eps"))
      .tie_weights(r.boolean_or("tie_word_embeddings", false))
      .mlp_bias(r.boolean_or("mlp_bias", false))
      .qk_norm(type == "qwen3");
  // Qwen2's q, k and v always carry biases (its attention has no flag);
  // Llama's and Qwen3's attention_bias sets all four projections'.
  const bool attention_bias = r.boolean_or("attention_bias", false);
  o.qkv_bias(type == "qwen2" || attention_bias).o_bias(type != "qwen2" && attention_bias);
  read_rope(r, o);
  o.block_size(block_size > 0 ? block_size : o.max_position_embeddings());
  o.sliding_window(sliding_window(r, type));
  try {
    validate(o);
  } catch (const c10::ValueError& e) {
    TORCH_CHECK_VALUE(false, where, ": ", e.what_without_backtrace());
  }
  return o;
}

std::string llama_hf_config(const LlamaOptions& o, const std::string& dtype) {
  nlohmann::ordered_json c;
  const std::string& type = o.model_type();
  const std::string arch = type == "llama" ? "LlamaForCausalLM" : type == "mistral" ? "MistralForCausalLM"
                           : type == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM";
  c["architectures"] = {arch};
  c["model_type"] = type;
  c["hidden_size"] = o.n_embd();
  c["intermediate_size"] = o.intermediate_size();
  c["num_hidden_layers"] = o.n_layer();
  c["num_attention_heads"] = o.n_head();
  c["num_key_value_heads"] = o.kv_heads();
  c["head_dim"] = o.head_size();
  c["hidden_act"] = "silu";
  c["vocab_size"] = o.vocab_size();
  c["max_position_embeddings"] = o.max_position_embeddings();
  c["rms_norm_eps"] = o.rms_norm_eps();
  c["rope_theta"] = o.rope_theta();
  const auto& s = o.rope_scaling();
  if (s.type == "none") {
    c["rope_scaling"] = nullptr;
  } else {
    nlohmann::ordered_json rs{{"rope_type", s.type}, {"factor", s.factor}};
    if (s.type == "llama3") {
      rs["low_freq_factor"] = s.low_freq_factor;
      rs["high_freq_factor"] = s.high_freq_factor;
      rs["original_max_position_embeddings"] = s.original_max_position;
    }
    c["rope_scaling"] = rs;
  }
  c["tie_word_embeddings"] = o.tie_weights();
  if (type == "llama" || type == "qwen3") c["attention_bias"] = o.o_bias();
  if (type == "llama") c["mlp_bias"] = o.mlp_bias();
  if (type == "mistral") c["sliding_window"] = o.sliding_window() > 0 ? nlohmann::ordered_json(o.sliding_window()) : nullptr;
  if (type == "qwen2" || type == "qwen3") c["use_sliding_window"] = false;
  c["attention_dropout"] = 0.0;
  c["torch_dtype"] = dtype;
  return c.dump(2) + "\n";
}

}  // namespace strata::recipes
