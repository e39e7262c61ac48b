// The GPT's LoRA vocabulary (gpt.h): which of its Linears get adapters and
// how many adapter parameters that makes.
#include "strata/recipes/models/gpt/gpt.h"

namespace strata::recipes {

LoraTargets parse_lora_targets(const std::string& text) {
  if (text == "attn") return {true, false};
  if (text == "mlp") return {false, true};
  if (text == "attn,mlp" || text == "mlp,attn") return {true, true};
  TORCH_CHECK_VALUE(false, "unknown LoRA targets '", text, "'; allowed: attn, mlp, attn,mlp");
}

int64_t count_lora_parameters(const GPTOptions& o, int tp_size) {
  if (o.lora_rank() == 0) return 0;
  const auto targets = parse_lora_targets(o.lora_targets());
  const int64_t c = o.n_embd(), r = o.lora_rank(), t = tp_size;
  // A [r, in] + B [out, r] per adapter: r · (in + out). Under tensor
  // parallelism a column adapter's B and a row adapter's A split (features
  // divide by t: the heads do), the other matrix stays whole.
  const int64_t attn = targets.attn ? r * (c + 3 * c / t) + r * (c / t + c) : 0;
  const int64_t mlp = targets.mlp ? r * (c + 4 * c / t) + r * (4 * c / t + c) : 0;
  return o.n_layer() * (attn + mlp);
}

}  // namespace strata::recipes
