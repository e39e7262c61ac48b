#include "strata/core/file_text.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace strata {

std::string read_file_capped(const std::string& path, uint64_t max_bytes, const std::string& what) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  TORCH_CHECK_VALUE(!ec, "'", path, "' cannot be read: ", ec.message());
  TORCH_CHECK_VALUE(size <= max_bytes, "'", path, "' is ", size, " bytes; strata reads at most ", max_bytes >> 20,
                    " MiB of a ", what, " (refused unread)");
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK_VALUE(in, "'", path, "' cannot be read: ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string control_escaped(std::string_view text) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : text) {
    if (c >= 0x20 && c != 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += {'\\', 'x', digits[c >> 4], digits[c & 15]};
    }
  }
  return out;
}

}  // namespace strata
