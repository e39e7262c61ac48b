#include "strata/recipes/app/model_keys.h"

#include <c10/util/StringUtil.h>

#include <algorithm>

namespace strata::recipes {

ModelKeys cli_keys(const ModelRegistry& models) {
  ModelKeys keys;
  keys.presets = models.preset_names();
  keys.default_preset = models.default_preset();
  for (const ModelSpec* spec : models.specs()) {
    for (const auto& option : spec->options()) {
      auto it = std::find_if(keys.options.begin(), keys.options.end(),
                             [&](const ModelKey& k) { return k.option.key() == option.key(); });
      if (it == keys.options.end()) {
        keys.options.push_back({option, {spec->name()}, {option}, option.help()});
        continue;
      }
      // Families that word the key alike share its help; others each say theirs.
      if (option.help() != it->option.help()) {
        if (it->help == it->option.help()) it->help = c10::Join(", ", it->families) + ": " + it->help;
        it->help += "; " + spec->name() + ": " + option.help();
      }
      it->families.push_back(spec->name());
      it->declared.push_back(option);
    }
  }
  return keys;
}

}  // namespace strata::recipes
