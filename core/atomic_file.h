#pragma once
// Publishing files and directories so that a reader (or a resume after a
// crash) sees either the previous version or the complete new one, never a
// half-written one: write a temporary beside the target, flush it to disk,
// rename it into place, flush the directory entry. The one way strata writes
// outputs that other programs read (config.ini, summary.json, metrics.csv
// rewrites, checkpoints).
#include <functional>
#include <ostream>
#include <string>

namespace strata {

/// Writes `path` through `write(out)`: into "<dir>/.<name>.tmp-<pid>", fsync'd,
/// then renamed over `path`. On any failure the temporary is removed, `path`
/// is unchanged, and the error names the path and the reason.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);
void write_file_atomically(const std::string& path, const std::string& contents);

/// "" when a file can be created in directory `dir` (tried: a probe file is
/// created there and removed at once; permission bits alone do not tell, e.g.
/// for root or on a read-only mount), else why not (strerror text).
std::string directory_write_problem(const std::string& dir);

/// "" when file `path` can be written (atomically: a temporary beside it,
/// then renamed) -- its directory exists and takes new files, and `path` is
/// not a directory -- else why not, e.g. "directory '/x' does not exist".
std::string output_file_problem(const std::string& path);

/// Renames a fully written directory `from` to `to` (replacing an existing
/// `to`), after fsync-ing every file in `from`; then fsyncs the parent.
void publish_directory(const std::string& from, const std::string& to);

}  // namespace strata
