// output_dir_test - check_output_dir (recipes/app/output_dir.cpp): an unusable
// --output-dir is a one-line error naming it and the reason, and the check
// leaves nothing behind, whether it passes or fails.
#include "strata/recipes/app/output_dir.h"

#include "tests/error_text.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {
namespace fs = std::filesystem;
using strata::recipes::check_output_dir;
using strata::testing::what_of;

class OutputDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("strata-output-dir-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  /// Everything under root_, to show nothing was left behind.
  size_t entries() const {
    size_t n = 0;
    for (auto it = fs::recursive_directory_iterator(root_); it != fs::recursive_directory_iterator(); ++it) ++n;
    return n;
  }
  fs::path root_;
};

TEST_F(OutputDirTest, CreatableOrWritableDirectoryPassesAndLeavesOnlyTheDirectory) {
  EXPECT_NO_THROW(check_output_dir((root_ / "a/b/c").string()));
  EXPECT_NO_THROW(check_output_dir((root_ / "a/b/c/").string()));
  EXPECT_TRUE(fs::is_directory(root_ / "a/b/c"));
  EXPECT_EQ(entries(), 3u) << "the directories stay for the run; no probe file is left";
  fs::remove_all(root_ / "a");
  fs::create_directories(root_ / "existing");
  { std::ofstream(root_ / "existing/keep.txt") << "x"; }
  EXPECT_NO_THROW(check_output_dir((root_ / "existing").string()));
  EXPECT_EQ(entries(), 2u) << "an existing directory keeps exactly what it had";
  EXPECT_TRUE(fs::exists(root_ / "existing/keep.txt"));
}

TEST_F(OutputDirTest, ConcurrentChecksOfOneNewPathAllPass) {
  // Two launchers on a shared filesystem (e.g. --nnodes on one machine)
  // may check the same new directory at once: a mkdir that loses the race
  // finds it existing, which is fine, not "cannot create".
  for (int round = 0; round < 20; ++round) {
    const std::string dir = (root_ / ("run" + std::to_string(round)) / "out").string();
    std::vector<std::string> errors(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] { errors[t] = what_of([&] { check_output_dir(dir); }); });
    }
    for (auto& thread : threads) thread.join();
    for (int t = 0; t < 4; ++t) EXPECT_EQ(errors[t], "<no exception>") << "round " << round << " thread " << t;
  }
}

TEST_F(OutputDirTest, UncreatablePathNamesThePathAndWhy) {
  { std::ofstream(root_ / "file") << "x"; }
  // A regular file where a directory must go: as the directory, or as a parent.
  std::string error = what_of([&] { check_output_dir((root_ / "file").string()); });
  EXPECT_NE(error.find("'" + (root_ / "file").string() + "'"), std::string::npos) << error;
  EXPECT_NE(error.find("not a directory"), std::string::npos) << error;
  error = what_of([&] { check_output_dir((root_ / "file/out").string()); });
  EXPECT_NE(error.find((root_ / "file/out").string()), std::string::npos) << error;
  EXPECT_NE(error.find("not a directory"), std::string::npos) << error;
  // procfs refuses new directories, even to root.
  error = what_of([] { check_output_dir("/proc/strata-x/y"); });
  EXPECT_NE(error.find("cannot use --output-dir '/proc/strata-x/y'"), std::string::npos) << error;
  EXPECT_NE(error.find("cannot create '/proc/strata-x'"), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_FALSE(fs::exists("/proc/strata-x"));
  // An existing directory that takes no files: the probe file finds out.
  error = what_of([] { check_output_dir("/proc"); });
  EXPECT_NE(error.find("cannot use --output-dir '/proc': cannot create files in '/proc'"), std::string::npos)
      << error;
  EXPECT_NE(what_of([] { check_output_dir(""); }).find("--output-dir must not be empty"), std::string::npos);
  EXPECT_EQ(entries(), 1u);  // just "file"
}

TEST_F(OutputDirTest, ReadOnlyDirectoryIsRefusedWhenPermissionsApply) {
  fs::create_directories(root_ / "ro");
  fs::permissions(root_ / "ro", fs::perms::owner_read | fs::perms::owner_exec);
  const bool enforced = ::access((root_ / "ro").c_str(), W_OK) != 0;
  const std::string error = what_of([&] { check_output_dir((root_ / "ro/out").string()); });
  fs::permissions(root_ / "ro", fs::perms::owner_all);
  if (!enforced) GTEST_SKIP() << "running as root: a mode-0500 directory is writable";
  EXPECT_NE(error.find("cannot create '" + (root_ / "ro/out").string() + "'"), std::string::npos) << error;
  EXPECT_NE(error.find("Permission denied"), std::string::npos) << error;
}
}  // namespace
