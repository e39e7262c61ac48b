#pragma once
// TcpStore: the rendezvous key-value store, a c10d::Store over TCP.
//
// c10d's TCPStore in LibTorch 1.13 binds its server to every interface; this
// one listens on the given address only (127.0.0.1 keeps a single-machine run
// off the network). One process (rank 0) is the server; every process,
// the server's included, talks to it through its own client connection.
//
// Wire protocol (one request, one reply, on a connection; integers in host
// byte order since every peer runs the same binary): a request is a one-byte
// command followed by its fields; strings and byte arrays are a uint32 length
// followed by the bytes. A reply is a one-byte status (ok, timeout, error)
// followed by one byte array: the command's result, or the error message.
// get() and wait() carry their timeout, so the server answers "timeout"
// itself and a blocked request never leaves the stream out of step.
//
// Example:
//   auto store = c10::make_intrusive<strata::TcpStore>("127.0.0.1", 29500,
//                                                      rank == 0, std::chrono::seconds(60));
//   store->set("key", {1, 2, 3});
//   auto v = store->get("key");   // blocks until some rank has set it
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace strata {

class TcpStoreServer;

class TcpStore : public c10d::Store {
 public:
  /// `is_server`: also start the server, listening on host:port only (port 0:
  /// any free port, see port()). Errors: "MASTER_PORT <port> on <host> is
  /// already in use". Every instance then connects as a client, retrying until
  /// `timeout`: "could not reach MASTER_ADDR <host>:<port> within <t> s".
  /// `timeout` is also the default for get() and wait().
  TcpStore(std::string host, int port, bool is_server, std::chrono::milliseconds timeout);
  /// Closes the connection; a server stops accepting, wakes every blocked
  /// request and joins its threads.
  ~TcpStore() override;

  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  /// Sets `key` to `desired` if its value is `expected` (or it is absent and
  /// `expected` is empty); returns the value the key has afterwards.
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  /// Blocks until `key` exists or the store's timeout passes (then throws).
  std::vector<uint8_t> get(const std::string& key) override;
  /// Adds to a counter stored as decimal text (absent counts as 0); returns the new value.
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  /// Blocks until every key exists; throws after `timeout` (0: wait forever).
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  const std::string& host() const { return host_; }
  /// The port the server listens on (resolved when constructed with port 0).
  int port() const { return port_; }
  bool is_server() const { return static_cast<bool>(server_); }

 private:
  class Request;
  struct Reply {
    bool timed_out = false;  ///< the server's wait for the keys ran out
    std::vector<uint8_t> payload;
  };
  /// Sends one request and reads its reply (waiting at most `reply_within`,
  /// 0: no limit); throws on a server-side error or a broken connection.
  Reply round_trip(const Request& request, std::chrono::milliseconds reply_within, const char* op);

  std::string host_;
  int port_;
  std::unique_ptr<TcpStoreServer> server_;
  std::mutex mutex_;  ///< one request at a time on the client socket
  int fd_ = -1;
};

}  // namespace strata
