#include "strata/strategies/offload_tier.h"

#include "strata/core/cuda_support.h"

#include <ATen/record_function.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <signal.h>

#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace strata {

namespace {

std::string errno_text(int error) { return std::strerror(error); }

/// Adds its own lifetime, in nanoseconds, to `total` (I/O time, all threads).
class IoTimer {
 public:
  explicit IoTimer(std::atomic<int64_t>& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~IoTimer() {
    total_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
  }
  IoTimer(const IoTimer&) = delete;
  IoTimer& operator=(const IoTimer&) = delete;

 private:
  std::atomic<int64_t>& total_;
  std::chrono::steady_clock::time_point start_;
};

constexpr const char* kNamedPrefix = ".strata-offload-";

/// Removes the names of fallback offload files (below) whose process is gone:
/// a process killed between mkostemp() and unlink() -- microseconds -- leaves
/// one behind, and this is where it is collected. A name whose process lives
/// (or whose pid was reused) stays; removing a name never affects a process
/// that has the file open (its own next step is the same unlink).
void remove_stale_named_files(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kNamedPrefix, 0) != 0) continue;
    const std::string rest = name.substr(std::strlen(kNamedPrefix));
    const auto dash = rest.find('-');
    if (dash == std::string::npos || dash == 0 || rest.find_first_not_of("0123456789") != dash) continue;
    const long pid = std::strtol(rest.substr(0, dash).c_str(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) ::unlink(entry.path().c_str());
  }
}

/// An unnamed file in `dir`: O_TMPFILE (never has a name, so no kill can
/// leave it behind), else a named one, ".strata-offload-<pid>-XXXXXX",
/// unlinked at once; a name a kill left in that window is removed by the next
/// run's remove_stale_named_files(). Returns the descriptor, or -1 with errno set.
int open_unnamed_file(const std::string& dir) {
  remove_stale_named_files(dir);
#ifdef O_TMPFILE
  if (std::getenv("STRATA_TEST_OFFLOAD_NO_TMPFILE") == nullptr) {  // testing aid: force the fallback
    int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) return fd;
    // EISDIR / EOPNOTSUPP: the kernel or filesystem lacks O_TMPFILE; fall back.
    if (errno != EISDIR && errno != EOPNOTSUPP) return -1;
  }
#endif
  std::string path = dir + "/" + kNamedPrefix + std::to_string(::getpid()) + "-XXXXXX";
  int fd2 = ::mkostemp(path.data(), O_CLOEXEC);
  if (fd2 < 0) return -1;
  ::unlink(path.c_str());  // gone from the directory now; the space stays ours until close
  return fd2;
}

class DiskTier final : public OffloadTier {
 public:
  explicit DiskTier(std::string dir) : dir_(std::move(dir)) {
    const auto problem = disk_tier_problem(dir_);
    TORCH_CHECK_VALUE(problem.empty(), problem);
    fd_ = open_unnamed_file(dir_);
    TORCH_CHECK(fd_ >= 0, "cannot use --offload-dir '", dir_, "': ", errno_text(errno));
  }
  ~DiskTier() override {
    if (fd_ >= 0) ::close(fd_);  // the unnamed file's space is released here
  }

  Region allocate(int64_t nbytes) override {
    TORCH_CHECK(nbytes >= 0, "OffloadTier: cannot allocate ", nbytes, " bytes");
    Region region{static_cast<int64_t>(offsets_.size()), nbytes};
    offsets_.push_back(bytes_);
    if (nbytes > 0) {
      // Reserve now: a disk too small fails here, at setup, naming the directory.
      const int error = ::posix_fallocate(fd_, bytes_, nbytes);
      TORCH_CHECK(error == 0, "cannot use --offload-dir '", dir_, "': reserving ", bytes_ + nbytes,
                  " bytes of offloaded state failed: ", errno_text(error));
    }
    bytes_ += nbytes;
    return region;
  }

  std::string describe() const override { return "disk (" + dir_ + ", unnamed file)"; }

 protected:
  void read_bytes(const Region& region, int64_t byte_offset, void* dst, int64_t nbytes) override {
    transfer(region, byte_offset, nbytes, [&](int64_t done, int64_t at) {
      return ::pread(fd_, static_cast<char*>(dst) + done, nbytes - done, at);
    }, "read");
  }
  void write_bytes(const Region& region, int64_t byte_offset, const void* src, int64_t nbytes) override {
    transfer(region, byte_offset, nbytes, [&](int64_t done, int64_t at) {
      return ::pwrite(fd_, static_cast<const char*>(src) + done, nbytes - done, at);
    }, "write");
  }

 private:
  template <typename Io>
  void transfer(const Region& region, int64_t byte_offset, int64_t nbytes, Io&& io, const char* what) {
    const int64_t base = offsets_.at(region.id) + byte_offset;
    int64_t done = 0;
    while (done < nbytes) {
      const ssize_t n = io(done, base + done);
      if (n < 0 && errno == EINTR) continue;
      TORCH_CHECK(n > 0, "offload ", what, " of ", nbytes, " bytes at ", base + done, " in '", dir_,
                  "' failed: ", n < 0 ? errno_text(errno) : std::string("end of file"));
      done += n;
    }
  }

  std::string dir_;
  int fd_ = -1;
  std::vector<int64_t> offsets_;  // per region: its first byte in the file
};

class HostTier final : public OffloadTier {
 public:
  HostTier() {
    TORCH_CHECK_VALUE(built_with_cuda(),
                      "--offload cpu keeps state in pinned host memory beside a CUDA device, but this "
                      "LibTorch has no CUDA; use --offload disk");
  }
  Region allocate(int64_t nbytes) override {
    Region region{static_cast<int64_t>(buffers_.size()), nbytes};
    // Pinned: copies between it and the device can be asynchronous.
    buffers_.push_back(torch::zeros({nbytes}, torch::kUInt8).pin_memory());
    bytes_ += nbytes;
    return region;
  }
  std::string describe() const override { return "pinned host memory"; }

 protected:
  void read_bytes(const Region& region, int64_t byte_offset, void* dst, int64_t nbytes) override {
    std::memcpy(dst, buffers_.at(region.id).data_ptr<uint8_t>() + byte_offset, nbytes);
  }
  void write_bytes(const Region& region, int64_t byte_offset, const void* src, int64_t nbytes) override {
    std::memcpy(buffers_.at(region.id).data_ptr<uint8_t>() + byte_offset, src, nbytes);
  }

 private:
  std::vector<torch::Tensor> buffers_;
};

}  // namespace

int64_t OffloadTier::check_range(const Region& region, int64_t byte_offset, const torch::Tensor& t,
                                 const char* what) const {
  TORCH_CHECK(t.is_contiguous() && t.device().is_cpu(), "OffloadTier::", what,
              " needs a contiguous CPU tensor (got ", t.device(), ", contiguous ", t.is_contiguous(), ")");
  const int64_t nbytes = static_cast<int64_t>(t.nbytes());
  TORCH_CHECK(region.id >= 0 && byte_offset >= 0 && byte_offset + nbytes <= region.nbytes, "OffloadTier::",
              what, ": bytes [", byte_offset, ", ", byte_offset + nbytes, ") outside region ", region.id,
              " of ", region.nbytes, " bytes");
  return nbytes;
}

void OffloadTier::read(const Region& region, int64_t byte_offset, const torch::Tensor& dst) {
  RECORD_FUNCTION("strata::offload_read", std::vector<c10::IValue>());  // a span in --profile traces
  const int64_t nbytes = check_range(region, byte_offset, dst, "read");
  IoTimer timer(nanoseconds_);
  read_bytes(region, byte_offset, dst.data_ptr(), nbytes);
  bytes_read_ += nbytes;
}

void OffloadTier::write(const Region& region, int64_t byte_offset, const torch::Tensor& src) {
  RECORD_FUNCTION("strata::offload_write", std::vector<c10::IValue>());
  const int64_t nbytes = check_range(region, byte_offset, src, "write");
  IoTimer timer(nanoseconds_);
  write_bytes(region, byte_offset, src.data_ptr(), nbytes);
  bytes_written_ += nbytes;
}

OffloadIoStats OffloadTier::stats() const {
  return {bytes_read_.load(), bytes_written_.load(), static_cast<double>(nanoseconds_.load()) * 1e-9};
}

OffloadKind parse_offload(const std::string& name) {
  if (name == "none") return OffloadKind::kNone;
  if (name == "cpu") return OffloadKind::kCpu;
  if (name == "disk") return OffloadKind::kDisk;
  TORCH_CHECK_VALUE(false, "unknown offload '", name, "'; available: none, cpu, disk");
}

std::string to_string(OffloadKind kind) {
  switch (kind) {
    case OffloadKind::kNone: return "none";
    case OffloadKind::kCpu: return "cpu";
    case OffloadKind::kDisk: return "disk";
  }
  return "unknown";
}

void check_offload_kind(OffloadKind kind, const std::string& dir, const torch::Device& device) {
  TORCH_CHECK_VALUE(!(kind == OffloadKind::kCpu && !device.is_cuda()),
                    "--offload cpu moves state off a CUDA device into pinned host memory, but the device is ",
                    device, ", whose state is already in host memory; use --offload disk to move it out of memory");
  TORCH_CHECK_VALUE(!(kind == OffloadKind::kDisk && dir.empty()), "--offload disk needs an --offload-dir");
}

std::unique_ptr<OffloadTier> make_offload_tier(OffloadKind kind, const std::string& dir) {
  TORCH_CHECK(kind != OffloadKind::kNone, "make_offload_tier: no tier for --offload none");
  return kind == OffloadKind::kDisk ? make_disk_tier(dir) : make_host_tier();
}

std::unique_ptr<OffloadTier> make_disk_tier(const std::string& dir) { return std::make_unique<DiskTier>(dir); }

std::unique_ptr<OffloadTier> make_host_tier() { return std::make_unique<HostTier>(); }

std::string disk_tier_problem(const std::string& dir) {
  const std::string prefix = "cannot use --offload-dir '" + dir + "': ";
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return prefix + errno_text(errno);
  if (!S_ISDIR(st.st_mode)) return prefix + "not a directory";
  // Creating is the only honest test of writability (access() says yes to root).
  const int fd = open_unnamed_file(dir);
  if (fd < 0) return prefix + errno_text(errno);
  ::close(fd);
  return "";
}

int64_t free_bytes_at(const std::string& dir) {
  struct statvfs vfs {};
  TORCH_CHECK(::statvfs(dir.c_str(), &vfs) == 0, "cannot use --offload-dir '", dir, "': ", errno_text(errno));
  return static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
}

IoQueue::IoQueue() : worker_([this] { run(); }) {}

IoQueue::~IoQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_one();
  worker_.join();
}

std::future<void> IoQueue::submit(std::function<void()> task) {
  std::packaged_task<void()> packaged(std::move(task));
  auto future = packaged.get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(packaged));
  }
  ready_.notify_one();
  return future;
}

void IoQueue::run() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and everything queued has run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();  // an exception is stored in the task's future
  }
}

void stream_chunks(IoQueue& io, size_t n, const std::function<void(size_t)>& read,
                   const std::function<void(size_t)>& compute, const std::function<void(size_t)>& write) {
  if (n == 0) return;
  std::vector<std::future<void>> queued;
  struct WaitAll {
    std::vector<std::future<void>>& futures;
    ~WaitAll() {
      for (auto& f : futures) {
        if (f.valid()) f.wait();
      }
    }
  } wait_all{queued};
  size_t next_read = queued.size();
  queued.push_back(io.submit([&read] { read(0); }));
  for (size_t i = 0; i < n; ++i) {
    // Sync point: chunk i's bytes must be in its staging set before compute reads them.
    queued[next_read].get();
    if (i + 1 < n) {
      // The other set was last used by chunk i-1, whose write was queued
      // before this read: the FIFO I/O thread finishes that write first.
      next_read = queued.size();
      queued.push_back(io.submit([&read, i] { read(i + 1); }));
    }
    compute(i);
    queued.push_back(io.submit([&write, i] { write(i); }));
  }
  // Sync point: whoever reads the tier next sees every chunk written back.
  for (auto& f : queued) {
    if (f.valid()) f.get();  // rethrows an I/O error
  }
}

void refuse_offloaded_checkpoint(bool saving) {
  TORCH_CHECK(false, "torch::serialize archives of offloaded optimizer state are not supported (cannot ",
              saving ? "save" : "load", " one); strata's checkpoints (trainer/checkpoint.h) stream it from the tier");
}

StatePiece tier_piece(OffloadTier& tier, const OffloadTier::Region& region, int64_t byte_offset, int64_t numel,
                      torch::ScalarType dtype, std::string name, std::vector<int64_t> shape, int64_t lo) {
  StatePiece piece;
  piece.name = std::move(name);
  piece.shape = std::move(shape);
  piece.dtype = dtype;
  piece.lo = lo;
  piece.numel = numel;
  const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
  piece.read = [&tier, region, byte_offset, esize](int64_t offset, const torch::Tensor& dst) {
    tier.read(region, byte_offset + offset * esize, dst);
  };
  piece.write = [&tier, region, byte_offset, esize](int64_t offset, const torch::Tensor& src) {
    tier.write(region, byte_offset + offset * esize, src);
  };
  return piece;
}

StatePiece step_piece(std::string name, int64_t* step) {
  StatePiece piece;
  piece.name = std::move(name);
  piece.shape = {};
  piece.dtype = torch::kLong;
  piece.values = torch::full({1}, *step, torch::kLong);
  piece.on_loaded = [step](const torch::Tensor& v) { *step = v.item<int64_t>(); };
  return piece;
}

}  // namespace strata
