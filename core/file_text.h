#pragma once
// Reading a whole file that came from elsewhere (a config, an index, an
// adapter's config) with a cap on its size, checked before a byte is read:
// a file of hundreds of megabytes where a config never needs more than a few
// is refused in one line, not read into memory (issue 48).
#include <cstdint>
#include <string>
#include <string_view>

namespace strata {

/// The most bytes strata reads of a JSON, YAML or INI config or index (the
/// largest real ones, a 405B model's model.safetensors.index.json or
/// Llama 3's tokenizer_config.json, are well under 2 MiB).
inline constexpr uint64_t kMaxConfigFileBytes = uint64_t{64} << 20;

/// The bytes of `path`. c10::ValueError, one line starting with the quoted
/// path, when it cannot be read or is larger than `max_bytes` (then nothing
/// of it is read; `what` names the kind of file in that message).
std::string read_file_capped(const std::string& path, uint64_t max_bytes, const std::string& what);

/// `text` with each control byte (newline included) as \xHH: an error that
/// quotes a file's keys or values, or a parser's message quoting the byte it
/// stopped at, stays one line.
std::string control_escaped(std::string_view text);

}  // namespace strata
