#pragma once
// The launcher's ranks as processes: each rank's environment (torchrun's
// variables) and error file, prepared before fork(), and the child's side of
// fork() + exec. Used by launcher.cpp only.
#include "strata/launch/launcher.h"

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace strata {

/// Everything a child needs, prepared before fork(): after fork() in a
/// multi-threaded process only async-signal-safe calls are allowed, so no
/// allocation happens there.
struct ChildSpec {
  std::vector<std::string> env_storage;
  std::vector<char*> envp;
  std::string error_file;
  std::string exec_failed_message;
};

/// Each local rank's environment (ours minus the variables we set, plus the
/// torchrun variables) and error file, in `dir`.
std::vector<ChildSpec> child_specs(const std::vector<std::string>& argv, const LaunchOptions& options,
                                   const std::filesystem::path& dir);

/// The child after fork(): dies with the launcher, default signal handling,
/// exec argv[0]; on failure writes why to its error file and exits 127.
[[noreturn]] void exec_child(const std::vector<char*>& argv, const ChildSpec& spec, pid_t parent);

}  // namespace strata
