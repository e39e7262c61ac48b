#include "strata/core/net.h"

#include <c10/util/Exception.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace strata {

namespace {

/// Closes a socket on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

std::string SocketAddress::host() const {
  char text[NI_MAXHOST] = {0};
  const int rc = ::getnameinfo(get(), length, text, sizeof(text), nullptr, 0, NI_NUMERICHOST);
  TORCH_CHECK(rc == 0, "getnameinfo failed for an address of family ", family, ": ",
              ::gai_strerror(rc));
  return text;
}

int SocketAddress::port() const {
  if (family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
}

std::vector<SocketAddress> resolve_host(const std::string& host, int port, SocketKind kind,
                                        const std::string& what) {
  TORCH_CHECK(!host.empty(), "cannot resolve ", what, " '': it is empty");
  TORCH_CHECK(port >= 0 && port <= 65535, "port ", port, " for ", what, " '", host,
              "' is outside [0, 65535]");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = kind == SocketKind::kStream ? SOCK_STREAM : SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* result = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &result);
  TORCH_CHECK(rc == 0, "cannot resolve ", what, " '", host, "': ", ::gai_strerror(rc));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(result, ::freeaddrinfo);
  std::vector<SocketAddress> out;
  for (const addrinfo* a = result; a != nullptr; a = a->ai_next) {
    if (a->ai_addrlen > sizeof(sockaddr_storage)) continue;
    SocketAddress s;
    std::memcpy(&s.storage, a->ai_addr, a->ai_addrlen);
    s.length = static_cast<socklen_t>(a->ai_addrlen);
    s.family = a->ai_family;
    out.push_back(s);
  }
  TORCH_CHECK(!out.empty(), "cannot resolve ", what, " '", host, "': no address");
  return out;
}

int find_free_port(const std::string& addr) {
  std::string last_error = "no address";
  for (const auto& a : resolve_host(addr, 0, SocketKind::kStream, "address")) {
    Fd fd(::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    SocketAddress bound;
    bound.length = sizeof(bound.storage);
    if (::bind(fd.get(), a.get(), a.length) == 0 &&
        ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound.storage), &bound.length) == 0) {
      bound.family = bound.storage.ss_family;
      return bound.port();
    }
    last_error = std::strerror(errno);
  }
  TORCH_CHECK(false, "find_free_port: cannot bind ", addr, ":0: ", last_error);
}

std::string local_address_towards(const std::string& host, const std::string& what) {
  std::string last_error = "no address";
  // Any port will do: connect() on a UDP socket only asks the kernel for a
  // route and fixes the source address; nothing is sent.
  for (const auto& a : resolve_host(host, 9, SocketKind::kDatagram, what)) {
    Fd fd(::socket(a.family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    SocketAddress local;
    local.length = sizeof(local.storage);
    if (::connect(fd.get(), a.get(), a.length) == 0 &&
        ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local.storage), &local.length) == 0) {
      local.family = local.storage.ss_family;
      return local.host();
    }
    last_error = std::strerror(errno);
  }
  TORCH_CHECK(false, "no local interface routes to ", what, " '", host, "': ", last_error);
}

}  // namespace strata
