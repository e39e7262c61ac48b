#include "strata/core/atomic_file.h"

#include <c10/util/StringUtil.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace strata {
namespace fs = std::filesystem;

namespace {

/// fsync(2) on a file or directory; the error names the path.
void sync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "cannot open '", path.string(), "' to sync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  TORCH_CHECK(rc == 0, "cannot sync '", path.string(), "' to disk: ", std::strerror(err));
}

fs::path parent_or_dot(const fs::path& path) {
  return path.has_parent_path() ? path.parent_path() : fs::path(".");
}

}  // namespace

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const fs::path target(path);
  const fs::path tmp = parent_or_dot(target) /
                       c10::str(".", target.filename().string(), ".tmp-", ::getpid());
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      TORCH_CHECK(out.good(), "cannot write '", tmp.string(), "': ", std::strerror(errno));
      write(out);
      out.flush();
      TORCH_CHECK(out.good(), "writing '", tmp.string(), "' failed: ", std::strerror(errno));
    }
    // Why fsync before rename: otherwise a crash can leave the new name
    // pointing at data that never reached the disk.
    sync_path(tmp, /*directory=*/false);
    std::error_code ec;
    fs::rename(tmp, target, ec);
    TORCH_CHECK(!ec, "cannot rename '", tmp.string(), "' to '", path, "': ", ec.message());
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
  sync_path(parent_or_dot(target), /*directory=*/true);
}

void write_file_atomically(const std::string& path, const std::string& contents) {
  write_file_atomically(path, [&](std::ostream& out) { out << contents; });
}

std::string directory_write_problem(const std::string& dir) {
  std::string probe = (fs::path(dir) / ".strata-write-probe-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) return std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

std::string output_file_problem(const std::string& path) {
  const fs::path parent = fs::absolute(fs::path(path)).parent_path();
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) return "directory '" + parent.string() + "' does not exist";
  if (fs::is_directory(fs::path(path), ec)) return "it is a directory";
  const std::string problem = directory_write_problem(parent.string());
  if (!problem.empty()) return "directory '" + parent.string() + "' does not take new files (" + problem + ")";
  return "";
}

void publish_directory(const std::string& from, const std::string& to) {
  const fs::path source(from);
  const fs::path target(to);
  for (const auto& entry : fs::recursive_directory_iterator(source)) {
    if (entry.is_regular_file()) sync_path(entry.path(), /*directory=*/false);
  }
  sync_path(source, /*directory=*/true);
  std::error_code ec;
  fs::remove_all(target, ec);
  TORCH_CHECK(!ec, "cannot replace '", to, "': ", ec.message());
  fs::rename(source, target, ec);
  TORCH_CHECK(!ec, "cannot rename '", from, "' to '", to, "': ", ec.message());
  sync_path(parent_or_dot(target), /*directory=*/true);
}

}  // namespace strata
