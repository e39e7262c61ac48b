// The Llama family's LoRA vocabulary (llama.h): which projections get
// adapters, and how many adapter parameters that makes.
#include "strata/recipes/models/llama/llama.h"


#include <algorithm>

namespace strata::recipes {

LlamaLoraTargets parse_llama_lora_targets(const std::string& text) {
  constexpr const char* kAllowed = "q, k, v, o, gate, up, down (or q_proj, ..., down_proj), comma-separated, or all";
  if (text == "all") return {true, true, true, true, true, true, true};
  const std::pair<const char*, bool LlamaLoraTargets::*> names[] = {
      {"q", &LlamaLoraTargets::q},       {"k", &LlamaLoraTargets::k},   {"v", &LlamaLoraTargets::v},
      {"o", &LlamaLoraTargets::o},       {"gate", &LlamaLoraTargets::gate}, {"up", &LlamaLoraTargets::up},
      {"down", &LlamaLoraTargets::down}};
  LlamaLoraTargets t;
  // Items split at commas (an empty one, as in "q," or "", is an error),
  // blanks around each ignored: PEFT's lists are often written "q, v".
  size_t from = 0;
  while (true) {
    const size_t comma = std::min(text.find(',', from), text.size());
    std::string item = text.substr(from, comma - from);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    const std::string name = item.ends_with("_proj") ? item.substr(0, item.size() - 5) : item;
    bool found = false;
    for (const auto& [known, member] : names) {
      if (name != known) continue;
      TORCH_CHECK_VALUE(!(t.*member), "LoRA targets '", text, "' name '", name, "' twice; allowed: ", kAllowed);
      t.*member = found = true;
    }
    TORCH_CHECK_VALUE(found, item.empty() ? "an empty LoRA target" : "unknown LoRA target '" + item + "'", " in '",
                      text, "'; allowed: ", kAllowed);
    if (comma == text.size()) return t;
    from = comma + 1;
  }
}

int64_t count_llama_lora_parameters(const LlamaOptions& o, int tp_size) {
  if (o.lora_rank() == 0) return 0;
  const auto t = parse_llama_lora_targets(o.lora_targets());
  const int64_t c = o.n_embd(), q = o.n_head() * o.head_size(), kv = o.kv_heads() * o.head_size();
  const int64_t f = o.intermediate_size(), r = o.lora_rank(), s = std::max(1, tp_size);
  // A [r, in] + B [out, r] per adapter. Under tensor parallelism a column
  // adapter's B and a row adapter's A split (their features divide by s:
  // tensor_parallel_problem checks it), the other matrix stays whole.
  auto column = [&](bool on, int64_t in, int64_t out) { return on ? r * in + r * out / s : 0; };
  auto row = [&](bool on, int64_t in, int64_t out) { return on ? r * in / s + r * out : 0; };
  const int64_t block = column(t.q, c, q) + column(t.k, c, kv) + column(t.v, c, kv) + row(t.o, q, c) +
                        column(t.gate, c, f) + column(t.up, c, f) + row(t.down, f, c);
  return o.n_layer() * block;
}

}  // namespace strata::recipes
