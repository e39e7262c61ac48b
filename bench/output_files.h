#pragma once
// strata-bench's output files (bench/bench_main.cpp): checked before anything
// is read or written, so bad input never destroys what a user has.
#include <string>

namespace strata::bench {

/// Writes `text` to `path`; c10::ValueError naming `flag` and the path when it cannot.
void write_text(const std::string& path, const std::string& text, const char* flag);

/// The same file, whether or not it exists yet (symlinks and ".." resolved).
bool same_file(const std::string& a, const std::string& b);

/// Exit-2 error unless `path` can be created or replaced: its directory
/// exists and is writable, and it is not a directory.
void check_writable_file(const std::string& flag, const std::string& path);

/// Exit-2 error unless directory `dir` exists or can be created: its nearest
/// existing ancestor (or itself) is a directory that takes new files.
void check_creatable_dir(const char* flag, const std::string& dir);

/// Creates `dir` (and its parents) or says in one line why it cannot.
void create_dir(const char* flag, const std::string& dir);

}  // namespace strata::bench
