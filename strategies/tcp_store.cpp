#include "strategies/tcp_store.h"

#include <c10/util/Exception.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <list>
#include <optional>
#include <thread>
#include <unordered_map>

namespace strata {

namespace {

using Clock = std::chrono::steady_clock;

enum class Command : uint8_t { kSet = 1, kCompareSet, kGet, kAdd, kDelete, kCheck, kNumKeys, kWait };
enum class Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

/// Largest key or value accepted off the wire; a bigger length means a
/// corrupt or foreign peer, and the connection is dropped.
constexpr uint32_t kMaxFieldBytes = 1u << 30;

std::string errno_text(int err) { return std::string(std::strerror(err)); }

/// Sends everything or returns false (peer gone). MSG_NOSIGNAL: a closed peer
/// must give an error, not kill the process with SIGPIPE.
bool send_all(int fd, const uint8_t* data, size_t len) {
  while (len > 0) {
    const ssize_t n = ::send(fd, data, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

enum class RecvResult { kOk, kClosed, kTimeout };

/// Receives exactly `len` bytes. With a deadline, gives up when it passes.
RecvResult recv_all(int fd, uint8_t* data, size_t len, std::optional<Clock::time_point> deadline) {
  while (len > 0) {
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now());
      if (left.count() <= 0) return RecvResult::kTimeout;
      pollfd p{fd, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) continue;  // re-check the deadline
      if (r < 0) return RecvResult::kClosed;
    }
    const ssize_t n = ::recv(fd, data, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return RecvResult::kClosed;
    data += n;
    len -= static_cast<size_t>(n);
  }
  return RecvResult::kOk;
}

void put_u8(std::vector<uint8_t>& out, uint8_t v) { out.push_back(v); }
template <typename T>
void put_pod(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}
void put_bytes(std::vector<uint8_t>& out, const uint8_t* data, size_t len) {
  TORCH_CHECK(len <= kMaxFieldBytes, "TcpStore: field of ", len, " bytes exceeds the limit of ",
              kMaxFieldBytes);
  put_pod<uint32_t>(out, static_cast<uint32_t>(len));
  out.insert(out.end(), data, data + len);
}
void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put_bytes(out, reinterpret_cast<const uint8_t*>(s.data()), s.size());
}
void put_vector(std::vector<uint8_t>& out, const std::vector<uint8_t>& v) {
  put_bytes(out, v.data(), v.size());
}

/// Server-side reader over a blocking socket (no deadline: the server's
/// destructor wakes it with shutdown()).
class Reader {
 public:
  explicit Reader(int fd) : fd_(fd) {}
  bool u8(uint8_t& v) { return pod(v); }
  bool i64(int64_t& v) { return pod(v); }
  bool u32(uint32_t& v) { return pod(v); }
  bool bytes(std::vector<uint8_t>& v) {
    uint32_t len = 0;
    if (!u32(len) || len > kMaxFieldBytes) return false;
    v.resize(len);
    return len == 0 || recv_all(fd_, v.data(), len, std::nullopt) == RecvResult::kOk;
  }
  bool string(std::string& s) {
    std::vector<uint8_t> v;
    if (!bytes(v)) return false;
    s.assign(v.begin(), v.end());
    return true;
  }
  bool strings(std::vector<std::string>& keys) {
    uint32_t n = 0;
    if (!u32(n) || n > kMaxFieldBytes) return false;
    keys.resize(n);
    for (auto& k : keys)
      if (!string(k)) return false;
    return true;
  }

 private:
  template <typename T>
  bool pod(T& v) {
    return recv_all(fd_, reinterpret_cast<uint8_t*>(&v), sizeof(T), std::nullopt) == RecvResult::kOk;
  }
  int fd_;
};

std::string keys_text(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size(); ++i) out += (i ? ", " : "") + keys[i];
  return out + "]";
}

std::string seconds_text(std::chrono::milliseconds t) {
  return c10::str(static_cast<double>(t.count()) / 1000.0);
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { ::freeaddrinfo(a); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

/// Resolves host:port for TCP; returns nullptr and sets `error` on failure.
AddrInfoPtr resolve(const std::string& host, int port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* result = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &result);
  if (rc != 0) {
    error = ::gai_strerror(rc);
    return nullptr;
  }
  return AddrInfoPtr(result);
}

}  // namespace

// ---------------------------------------------------------------------------
// Server: an accept thread plus one thread per connection. Connections are few
// (one per rank) and mostly idle after the rendezvous, so a thread each keeps
// blocking get()/wait() trivial: the handler just waits on the condition variable.

class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, int port) {
    std::string error;
    AddrInfoPtr addrs = resolve(host, port, error);
    TORCH_CHECK(addrs, "TcpStore: cannot resolve MASTER_ADDR ", host, ": ", error);
    int last_errno = 0;
    for (addrinfo* a = addrs.get(); a != nullptr && listen_fd_ < 0; a = a->ai_next) {
      // SOCK_CLOEXEC: ranks are fork+exec'd by the launcher; they must not
      // inherit (and keep alive) the store's sockets.
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        last_errno = errno;
        continue;
      }
      // SO_REUSEADDR: a restarted job can reuse a port still in TIME_WAIT. It does
      // not let two live listeners share it on Linux, so EADDRINUSE stays exact.
      const int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
        listen_fd_ = fd;
        break;
      }
      last_errno = errno;
      ::close(fd);
    }
    TORCH_CHECK(listen_fd_ >= 0 || last_errno != EADDRINUSE, "MASTER_PORT ", port, " on ", host,
                " is already in use");
    TORCH_CHECK(listen_fd_ >= 0, "TcpStore: cannot listen on ", host, ":", port, ": ",
                errno_text(last_errno));

    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
    port_ = bound.ss_family == AF_INET6
                ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);

    if (::pipe2(wake_, O_CLOEXEC) != 0) {
      const int err = errno;
      ::close(listen_fd_);
      TORCH_CHECK(false, "TcpStore: pipe2 failed: ", errno_text(err));
    }
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  ~TcpStoreServer() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      // Why shutdown (not close): it wakes a handler blocked in recv() on that
      // socket without freeing the descriptor number under its feet; the
      // handler closes its own socket on the way out.
      for (auto& c : connections_)
        if (c.open) ::shutdown(c.fd, SHUT_RDWR);
    }
    // Why: handlers blocked in get()/wait() sleep on the condition variable;
    // they re-check stopping_ and exit.
    cv_.notify_all();
    // Why the pipe: poll() in the accept loop watches it, so accept() never
    // blocks past destruction.
    const uint8_t byte = 1;
    while (::write(wake_[1], &byte, 1) < 0 && errno == EINTR) {
    }
    accept_thread_.join();
    // No new connection can appear now (the accept loop has exited).
    for (auto& c : connections_) c.thread.join();
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

  int port() const { return port_; }

 private:
  struct Connection {
    int fd = -1;
    bool open = true;
    std::thread thread;
  };

  void accept_loop() {
    while (true) {
      pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      const int r = ::poll(fds, 2, -1);
      if (r < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents != 0) return;  // destructor asked us to stop
      if ((fds[0].revents & POLLIN) == 0) continue;
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;  // e.g. the peer gave up already; keep serving others
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) {
        ::close(fd);
        return;
      }
      Connection& c = connections_.emplace_back();
      c.fd = fd;
      c.thread = std::thread([this, &c] { serve(c); });
    }
  }

  void serve(Connection& c) {
    while (handle_one(c.fd)) {
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ::close(c.fd);
    c.open = false;
  }

  static bool reply(int fd, Status status, const std::vector<uint8_t>& payload = {}) {
    std::vector<uint8_t> out;
    out.reserve(payload.size() + 5);
    put_u8(out, static_cast<uint8_t>(status));
    put_vector(out, payload);
    return send_all(fd, out.data(), out.size());
  }

  static std::vector<uint8_t> bytes_of(int64_t v) {
    std::vector<uint8_t> out;
    put_pod(out, v);
    return out;
  }

  bool has_all(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k) > 0; });
  }

  /// Blocks until every key exists (true), the timeout passes or the server
  /// stops (false). Caller holds `lock`.
  bool wait_for(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                int64_t timeout_ms) {
    // Why a condition variable: set()/add()/compareSet() from other
    // connections notify it, so a blocked get()/wait() wakes as soon as its
    // keys exist instead of polling.
    auto ready = [&] { return stopping_ || has_all(keys); };
    if (timeout_ms <= 0) {
      cv_.wait(lock, ready);
    } else {
      cv_.wait_until(lock, Clock::now() + std::chrono::milliseconds(timeout_ms), ready);
    }
    return !stopping_ && has_all(keys);
  }

  /// Serves one request; false when the connection is done.
  bool handle_one(int fd) {
    Reader in(fd);
    uint8_t cmd = 0;
    if (!in.u8(cmd)) return false;
    switch (static_cast<Command>(cmd)) {
      case Command::kSet: {
        std::string key;
        std::vector<uint8_t> value;
        if (!in.string(key) || !in.bytes(value)) return false;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          data_[key] = std::move(value);
        }
        cv_.notify_all();
        return reply(fd, Status::kOk);
      }
      case Command::kCompareSet: {
        std::string key;
        std::vector<uint8_t> expected, desired;
        if (!in.string(key) || !in.bytes(expected) || !in.bytes(desired)) return false;
        std::vector<uint8_t> result;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          auto it = data_.find(key);
          if ((it == data_.end() && expected.empty()) || (it != data_.end() && it->second == expected)) {
            data_[key] = desired;
            result = std::move(desired);
          } else {
            result = it == data_.end() ? std::move(expected) : it->second;
          }
        }
        cv_.notify_all();
        return reply(fd, Status::kOk, result);
      }
      case Command::kGet: {
        std::string key;
        int64_t timeout_ms = 0;
        if (!in.string(key) || !in.i64(timeout_ms)) return false;
        std::unique_lock<std::mutex> lock(mutex_);
        const bool found = wait_for(lock, {key}, timeout_ms);
        if (stopping_) return false;
        if (!found) {
          lock.unlock();
          return reply(fd, Status::kTimeout);
        }
        std::vector<uint8_t> value = data_.at(key);
        lock.unlock();
        return reply(fd, Status::kOk, value);
      }
      case Command::kAdd: {
        std::string key;
        int64_t delta = 0;
        if (!in.string(key) || !in.i64(delta)) return false;
        int64_t result = 0;
        std::string error;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          auto& value = data_[key];  // absent counts as 0
          const std::string text(value.begin(), value.end());
          try {
            size_t used = 0;
            const int64_t current = text.empty() ? 0 : std::stoll(text, &used);
            if (!text.empty() && used != text.size()) throw std::invalid_argument(text);
            result = current + delta;
            const std::string updated = std::to_string(result);
            value.assign(updated.begin(), updated.end());
          } catch (const std::exception&) {
            error = c10::str("TcpStore::add: key '", key, "' holds '", text, "', not an integer");
          }
        }
        if (!error.empty()) return reply(fd, Status::kError, {error.begin(), error.end()});
        cv_.notify_all();
        return reply(fd, Status::kOk, bytes_of(result));
      }
      case Command::kDelete: {
        std::string key;
        if (!in.string(key)) return false;
        bool erased = false;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          erased = data_.erase(key) > 0;
        }
        return reply(fd, Status::kOk, {static_cast<uint8_t>(erased)});
      }
      case Command::kCheck: {
        std::vector<std::string> keys;
        if (!in.strings(keys)) return false;
        bool present = false;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          present = has_all(keys);
        }
        return reply(fd, Status::kOk, {static_cast<uint8_t>(present)});
      }
      case Command::kNumKeys: {
        int64_t n = 0;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          n = static_cast<int64_t>(data_.size());
        }
        return reply(fd, Status::kOk, bytes_of(n));
      }
      case Command::kWait: {
        std::vector<std::string> keys;
        int64_t timeout_ms = 0;
        if (!in.strings(keys) || !in.i64(timeout_ms)) return false;
        std::unique_lock<std::mutex> lock(mutex_);
        const bool found = wait_for(lock, keys, timeout_ms);
        if (stopping_) return false;
        lock.unlock();
        return reply(fd, found ? Status::kOk : Status::kTimeout);
      }
    }
    const std::string error = c10::str("TcpStore: unknown command ", static_cast<int>(cmd));
    reply(fd, Status::kError, {error.begin(), error.end()});
    return false;  // the stream is out of step; drop the connection
  }

  int listen_fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};
  std::thread accept_thread_;
  std::mutex mutex_;  ///< guards data_, stopping_, connections_
  std::condition_variable cv_;
  std::unordered_map<std::string, std::vector<uint8_t>> data_;
  bool stopping_ = false;
  std::list<Connection> connections_;  ///< std::list: handlers hold references
};

// ---------------------------------------------------------------------------
// Client

class TcpStore::Request {
 public:
  explicit Request(Command cmd) { put_u8(buf_, static_cast<uint8_t>(cmd)); }
  Request& string(const std::string& s) {
    put_string(buf_, s);
    return *this;
  }
  Request& strings(const std::vector<std::string>& keys) {
    put_pod<uint32_t>(buf_, static_cast<uint32_t>(keys.size()));
    for (const auto& k : keys) put_string(buf_, k);
    return *this;
  }
  Request& bytes(const std::vector<uint8_t>& v) {
    put_vector(buf_, v);
    return *this;
  }
  Request& i64(int64_t v) {
    put_pod(buf_, v);
    return *this;
  }
  const std::vector<uint8_t>& buffer() const { return buf_; }

 private:
  std::vector<uint8_t> buf_;
};

namespace {

/// Connects to host:port, retrying (the server may not be up yet) until `timeout`.
int connect_with_retry(const std::string& host, int port, std::chrono::milliseconds timeout) {
  const bool forever = timeout.count() <= 0;
  const auto deadline = Clock::now() + timeout;
  auto backoff = std::chrono::milliseconds(10);
  std::string last_error = "no attempt made";
  while (true) {
    std::string error;
    if (AddrInfoPtr addrs = resolve(host, port, error)) {
      for (addrinfo* a = addrs.get(); a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                                a->ai_protocol);
        if (fd < 0) {
          last_error = errno_text(errno);
          continue;
        }
        // Non-blocking connect + poll: a host that drops SYNs must not hold us
        // past the deadline (a blocking connect can take minutes).
        int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
        int err = rc == 0 ? 0 : errno;
        if (rc != 0 && err == EINPROGRESS) {
          const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
          const int wait_ms = forever ? 1000 : static_cast<int>(std::clamp<int64_t>(left.count(), 1, 1000));
          pollfd p{fd, POLLOUT, 0};
          rc = ::poll(&p, 1, wait_ms);
          if (rc > 0) {
            socklen_t len = sizeof(err);
            ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          } else {
            err = rc == 0 ? ETIMEDOUT : errno;
          }
        }
        if (err == 0) {
          ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          return fd;
        }
        last_error = errno_text(err);
        ::close(fd);
      }
    } else {
      last_error = error;
    }
    const auto now = Clock::now();
    TORCH_CHECK(forever || now < deadline, "could not reach MASTER_ADDR ", host, ":", port,
                " within ", seconds_text(timeout), " s (last error: ", last_error, ")");
    // Why sleep: the server (rank 0) may simply not be listening yet; retry
    // with a short, growing backoff rather than spinning.
    auto nap = backoff;
    if (!forever) nap = std::min(nap, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) + std::chrono::milliseconds(1));
    std::this_thread::sleep_for(nap);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

/// How long a client waits for a reply: an operation that blocks on the
/// server (get, wait) is answered by the server when its own timeout passes,
/// so allow that plus a margin; 0 means no limit.
std::chrono::milliseconds reply_limit(std::chrono::milliseconds op_timeout) {
  if (op_timeout.count() <= 0) return std::chrono::milliseconds(0);
  return op_timeout + std::chrono::seconds(10);
}

}  // namespace

TcpStore::TcpStore(std::string host, int port, bool is_server, std::chrono::milliseconds timeout)
    : c10d::Store(timeout), host_(std::move(host)), port_(port) {
  TORCH_CHECK(port >= 0 && port <= 65535, "TcpStore: MASTER_PORT ", port,
              " is outside [0, 65535] (MASTER_ADDR ", host_, ")");
  if (is_server) {
    server_ = std::make_unique<TcpStoreServer>(host_, port_);
    port_ = server_->port();
  } else {
    TORCH_CHECK(port_ > 0, "TcpStore: a client needs the server's MASTER_PORT, got ", port_,
                " (MASTER_ADDR ", host_, ")");
  }
  fd_ = connect_with_retry(host_, port_, timeout);
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  // server_ is destroyed after this body: it wakes and joins its threads.
}

TcpStore::Reply TcpStore::round_trip(const Request& request, std::chrono::milliseconds reply_within,
                                     const char* op) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(fd_ >= 0, "TcpStore::", op, ": the connection to MASTER_ADDR ", host_, ":", port_,
              " was lost earlier");
  const auto& buf = request.buffer();
  std::optional<Clock::time_point> deadline;
  if (reply_within.count() > 0) deadline = Clock::now() + reply_within;

  auto fail = [&](const std::string& why) {
    // The stream may hold half a reply now; never reuse it.
    ::close(fd_);
    fd_ = -1;
    TORCH_CHECK(false, "TcpStore::", op, ": ", why, " (MASTER_ADDR ", host_, ":", port_, ")");
  };
  if (!send_all(fd_, buf.data(), buf.size())) fail("lost the connection to the store server");

  uint8_t status = 0;
  uint32_t len = 0;
  RecvResult r = recv_all(fd_, &status, 1, deadline);
  if (r == RecvResult::kOk) r = recv_all(fd_, reinterpret_cast<uint8_t*>(&len), sizeof(len), deadline);
  std::vector<uint8_t> payload;
  if (r == RecvResult::kOk && len > kMaxFieldBytes) fail(c10::str("corrupt reply of ", len, " bytes"));
  if (r == RecvResult::kOk) {
    payload.resize(len);
    if (len > 0) r = recv_all(fd_, payload.data(), len, deadline);
  }
  if (r == RecvResult::kTimeout) fail(c10::str("no reply within ", seconds_text(reply_within), " s"));
  if (r == RecvResult::kClosed) fail("the store server closed the connection (has rank 0 exited?)");

  switch (static_cast<Status>(status)) {
    case Status::kOk: return Reply{false, std::move(payload)};
    case Status::kTimeout: return Reply{true, {}};
    case Status::kError: TORCH_CHECK(false, std::string(payload.begin(), payload.end()));
  }
  fail(c10::str("unknown reply status ", static_cast<int>(status)));
  return {};
}

namespace {

void check_not_timed_out(bool timed_out, const char* op, const std::vector<std::string>& keys,
                         std::chrono::milliseconds timeout, const std::string& host, int port) {
  TORCH_CHECK(!timed_out, "TcpStore::", op, ": keys ", keys_text(keys), " not set within ",
              seconds_text(timeout), " s (MASTER_ADDR ", host, ":", port, ")");
}

}  // namespace

void TcpStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  round_trip(Request(Command::kSet).string(key).bytes(value), reply_limit(timeout_), "set");
}

std::vector<uint8_t> TcpStore::compareSet(const std::string& key,
                                          const std::vector<uint8_t>& expected,
                                          const std::vector<uint8_t>& desired) {
  return round_trip(Request(Command::kCompareSet).string(key).bytes(expected).bytes(desired),
                    reply_limit(timeout_), "compareSet")
      .payload;
}

std::vector<uint8_t> TcpStore::get(const std::string& key) {
  // The server blocks until the key exists, so get() is one round trip.
  const auto timeout = timeout_;
  auto reply = round_trip(Request(Command::kGet).string(key).i64(timeout.count()),
                          reply_limit(timeout), "get");
  check_not_timed_out(reply.timed_out, "get", {key}, timeout, host_, port_);
  return std::move(reply.payload);
}

int64_t TcpStore::add(const std::string& key, int64_t value) {
  const auto reply =
      round_trip(Request(Command::kAdd).string(key).i64(value), reply_limit(timeout_), "add").payload;
  TORCH_CHECK(reply.size() == sizeof(int64_t), "TcpStore::add: malformed reply of ", reply.size(), " bytes");
  int64_t result = 0;
  std::memcpy(&result, reply.data(), sizeof(result));
  return result;
}

bool TcpStore::deleteKey(const std::string& key) {
  const auto reply =
      round_trip(Request(Command::kDelete).string(key), reply_limit(timeout_), "deleteKey").payload;
  return !reply.empty() && reply[0] != 0;
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  const auto reply =
      round_trip(Request(Command::kCheck).strings(keys), reply_limit(timeout_), "check").payload;
  return !reply.empty() && reply[0] != 0;
}

int64_t TcpStore::getNumKeys() {
  const auto reply =
      round_trip(Request(Command::kNumKeys), reply_limit(timeout_), "getNumKeys").payload;
  TORCH_CHECK(reply.size() == sizeof(int64_t), "TcpStore::getNumKeys: malformed reply of ",
              reply.size(), " bytes");
  int64_t n = 0;
  std::memcpy(&n, reply.data(), sizeof(n));
  return n;
}

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  // Why the server waits (not a client-side poll loop): it is woken by the
  // set() that creates the last key, so the wait ends without polling delay.
  const auto reply = round_trip(Request(Command::kWait).strings(keys).i64(timeout.count()),
                                reply_limit(timeout), "wait");
  check_not_timed_out(reply.timed_out, "wait", keys, timeout, host_, port_);
}

}  // namespace strata
