#pragma once
// check_output_dir(): phase 1 of a run (bad input, exit 2) asks whether
// --output-dir can be used before anything is written or any rank launched.
#include <string>

namespace strata::recipes {

/// Throws c10::ValueError, one line naming `dir` and the reason, unless `dir`
/// is an existing directory this process can create files in, or can be
/// created (with its missing parents). Checks by doing: it creates the missing
/// directories and a probe file (removed), so it believes the filesystem, not
/// mode bits (root passes every permission check, /proc refuses anyway). On
/// success the directories stay (the run writes there next); on failure it
/// removes exactly the directories it created, leaving nothing behind. Safe
/// when several processes check the same path at once.
void check_output_dir(const std::string& dir);

}  // namespace strata::recipes
