// atomic_file_test - outputs are replaced whole or not at all.
#include "strata/core/atomic_file.h"
#include "tests/error_text.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace {
namespace fs = std::filesystem;
using strata::testing::what_of;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("strata-atomic-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(AtomicFileTest, ReplacesTheFileAndLeavesNoTemporary) {
  const auto dir = fresh_dir("replace");
  strata::write_file_atomically((dir / "a.txt").string(), "first\n");
  strata::write_file_atomically((dir / "a.txt").string(), "second\n");
  EXPECT_EQ(read(dir / "a.txt"), "second\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  fs::remove_all(dir);
}

TEST(AtomicFileTest, AFailedWriteKeepsThePreviousFile) {
  const auto dir = fresh_dir("fail");
  strata::write_file_atomically((dir / "a.txt").string(), "previous\n");
  EXPECT_THROW(strata::write_file_atomically((dir / "a.txt").string(),
                                             [](std::ostream& out) {
                                               out << "half";
                                               throw std::runtime_error("disk on fire");
                                             }),
               std::runtime_error);
  EXPECT_EQ(read(dir / "a.txt"), "previous\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  fs::remove_all(dir);
}

TEST(AtomicFileTest, AnUnwritableDirectoryIsAnErrorNamingThePath) {
  const auto msg = what_of([] { strata::write_file_atomically("/proc/strata-no/such.txt", "x"); });
  EXPECT_NE(msg.find("/proc/strata-no/"), std::string::npos) << msg;
}

TEST(AtomicFileTest, PublishDirectoryReplacesTheTarget) {
  const auto dir = fresh_dir("publish");
  fs::create_directories(dir / "old");
  strata::write_file_atomically((dir / "old" / "stale.txt").string(), "stale");
  fs::create_directories(dir / ".new.tmp");
  strata::write_file_atomically((dir / ".new.tmp" / "model.pt").string(), "weights");
  strata::publish_directory((dir / ".new.tmp").string(), (dir / "old").string());
  EXPECT_FALSE(fs::exists(dir / ".new.tmp"));
  EXPECT_FALSE(fs::exists(dir / "old" / "stale.txt"));
  EXPECT_EQ(read(dir / "old" / "model.pt"), "weights");
  fs::remove_all(dir);
}

}  // namespace
