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
  TORCH_CHECK_VALUE(!ec, what, " '", path, "' cannot be read: ", ec.message());
  TORCH_CHECK_VALUE(size <= max_bytes, what, " '", path, "' is ", size, " bytes; strata reads at most ",
                    max_bytes >> 20, " MiB of a ", what, " (refused unread)");
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK_VALUE(in, what, " '", path, "' cannot be read: ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace strata
