#pragma once
// Network addresses: the one place strata resolves host names (getaddrinfo).
//
// Used by the process group (which local address Gloo binds to) and the
// tests (free ports). Errors name the host (and port) involved.
#include <sys/socket.h>

#include <string>
#include <vector>

namespace strata {

/// One resolved socket address.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_UNSPEC;

  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  /// Numeric text of the host part: "127.0.0.1", "::1".
  std::string host() const;
  int port() const;
};

enum class SocketKind { kStream, kDatagram };

/// Every address `host` resolves to, with `port` filled in (IPv4 and IPv6, in
/// the resolver's order). Throws "cannot resolve <what> '<host>': <reason>".
/// `what` names the setting the host came from (e.g. "MASTER_ADDR").
std::vector<SocketAddress> resolve_host(const std::string& host, int port,
                                        SocketKind kind = SocketKind::kStream,
                                        const std::string& what = "host");

/// A TCP port that is free on `addr` now (bind to port 0, read it back, close);
/// for tests and tools (strata's launcher needs none: one machine meets in a
/// file, several at a port the user names).
/// Someone else may take it before the caller binds it.
int find_free_port(const std::string& addr);

/// The numeric address of this machine's interface that routes to `host`:
/// the source address the kernel would pick for a packet to it (a UDP
/// connect() sends nothing; getsockname() reads the choice). For a loopback
/// host that is the host itself; on a node of a cluster it is the address
/// peers reach this node at, whatever the node's own hostname resolves to.
std::string local_address_towards(const std::string& host, const std::string& what = "host");

}  // namespace strata
