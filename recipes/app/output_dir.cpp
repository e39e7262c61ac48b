#include "strata/recipes/app/output_dir.h"

#include "strata/core/atomic_file.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

namespace strata::recipes {
namespace fs = std::filesystem;

void check_output_dir(const std::string& dir) {
  TORCH_CHECK_VALUE(!dir.empty(), "--output-dir must not be empty");
  fs::path path = fs::path(dir).lexically_normal();
  if (path.has_parent_path() && path.filename().empty()) path = path.parent_path();  // "out/"

  // The directories to create: from `path` up to the nearest one that exists.
  std::vector<fs::path> missing;
  fs::path existing = path;
  std::error_code ec;
  while (!existing.empty() && !fs::exists(fs::symlink_status(existing, ec))) {
    missing.push_back(existing);
    existing = existing.parent_path();
  }
  if (existing.empty()) existing = ".";
  TORCH_CHECK_VALUE(fs::is_directory(existing, ec), "cannot use --output-dir '", dir, "': '",
                    existing.string(), "' exists and is not a directory");

  std::vector<fs::path> created;  // outermost first
  auto undo = [&created] {
    for (auto it = created.rbegin(); it != created.rend(); ++it) ::rmdir(it->c_str());
  };
  std::string failure;
  for (auto it = missing.rbegin(); it != missing.rend() && failure.empty(); ++it) {
    if (::mkdir(it->c_str(), 0777) == 0) {
      created.push_back(*it);
    } else if (errno == EEXIST && fs::is_directory(*it, ec)) {
      // Another process created it meanwhile (e.g. a second launcher on a
      // shared filesystem): usable, and not ours to remove.
    } else {
      failure = "cannot create '" + it->string() + "': " + std::strerror(errno);
    }
  }
  if (failure.empty()) {
    // Creating a directory is not writing into it (a directory can exist but be
    // read-only, or be a mount that refuses files): probe with a file.
    if (const std::string problem = directory_write_problem(path.string()); !problem.empty()) {
      failure = "cannot create files in '" + path.string() + "': " + problem;
    }
  }
  // On success the directories stay: the run writes into them next. Removing
  // them would race with another launcher checking the same path (--nnodes on
  // one machine or a shared filesystem), whose mkdir may be inside one of them.
  if (!failure.empty()) undo();
  TORCH_CHECK_VALUE(failure.empty(), "cannot use --output-dir '", dir, "': ", failure);
}

}  // namespace strata::recipes
