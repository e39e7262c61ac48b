#pragma once
// TempDir: a fresh, uniquely named directory for one test, removed with
// everything in it when destroyed.
#include <stdlib.h>

#include <filesystem>
#include <string>

namespace strata::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& stem = "strata-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (stem + "-XXXXXX")).string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace strata::testing
