#include "strata/bench/output_files.h"

#include "strata/core/atomic_file.h"

#include <c10/util/Exception.h>

#include <filesystem>
#include <fstream>

namespace strata::bench {
namespace fs = std::filesystem;

void write_text(const std::string& path, const std::string& text, const char* flag) {
  std::ofstream out(path);
  out << text;
  TORCH_CHECK_VALUE(out.good(), flag, " file '", path, "' cannot be written");
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec1, ec2;
  const auto x = fs::weakly_canonical(fs::absolute(a), ec1), y = fs::weakly_canonical(fs::absolute(b), ec2);
  return !ec1 && !ec2 && x == y;
}

void check_writable_file(const std::string& flag, const std::string& path) {
  const std::string problem = strata::output_file_problem(path);
  TORCH_CHECK_VALUE(problem.empty(), flag, " '", path, "': ", problem);
}

void check_creatable_dir(const char* flag, const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  fs::path existing = fs::absolute(dir, ec);
  while (!fs::exists(existing, ec) && existing != existing.parent_path()) existing = existing.parent_path();
  TORCH_CHECK_VALUE(fs::is_directory(existing, ec), flag, " '", dir, "': '", existing.string(),
                    "' exists and is not a directory");
  const std::string problem = strata::directory_write_problem(existing.string());
  TORCH_CHECK_VALUE(problem.empty(), flag, " '", dir, "' cannot be created or written: '", existing.string(),
                    "' does not take new files (", problem, ")");
}

void create_dir(const char* flag, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TORCH_CHECK_VALUE(!ec && fs::is_directory(dir), flag, " directory '", dir, "' cannot be created: ", ec.message());
}

}  // namespace strata::bench
