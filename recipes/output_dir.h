#pragma once
// check_output_dir(): phase 1 of a run (bad input, exit 2) asks whether
// --output-dir can be used before anything is written or any rank launched.
#include <string>

namespace strata::recipes {

/// Throws c10::ValueError, one line naming `dir` and the reason, unless `dir`
/// is an existing directory this process can create files in, or can be
/// created (with its missing parents). Checks by doing: it creates the missing
/// directories and a probe file, then removes exactly what it created, so it
/// leaves nothing behind either way and believes the filesystem, not mode bits
/// (root passes every permission check, /proc refuses anyway).
void check_output_dir(const std::string& dir);

}  // namespace strata::recipes
