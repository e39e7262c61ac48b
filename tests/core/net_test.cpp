// core/net: the one address lookup (resolve, free port, the local address
// that routes to a host).
#include "strata/core/net.h"
#include "tests/error_text.h"

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace {

using strata::testing::what_of;

TEST(NetTest, ResolvesNumericAndNamedHosts) {
  const auto v4 = strata::resolve_host("127.0.0.1", 1234);
  ASSERT_FALSE(v4.empty());
  EXPECT_EQ(v4[0].host(), "127.0.0.1");
  EXPECT_EQ(v4[0].port(), 1234);
  EXPECT_EQ(v4[0].family, AF_INET);
  const auto v6 = strata::resolve_host("::1", 7);
  ASSERT_FALSE(v6.empty());
  EXPECT_EQ(v6[0].host(), "::1");
  EXPECT_EQ(v6[0].family, AF_INET6);
  EXPECT_FALSE(strata::resolve_host("localhost", 0).empty());
}

TEST(NetTest, ResolveErrorsNameTheSettingAndTheHost) {
  // .invalid never resolves (RFC 2606).
  EXPECT_CONTAINS(what_of([] { strata::resolve_host("no-such-host.invalid", 1, strata::SocketKind::kStream, "MASTER_ADDR"); }),
                  "cannot resolve MASTER_ADDR 'no-such-host.invalid'");
  EXPECT_CONTAINS(what_of([] { strata::resolve_host("", 1, strata::SocketKind::kStream, "MASTER_ADDR"); }),
                  "cannot resolve MASTER_ADDR '': it is empty");
  EXPECT_CONTAINS(what_of([] { strata::resolve_host("127.0.0.1", 70000); }), "port 70000");
}

TEST(NetTest, FindFreePortReturnsABindablePort) {
  const int port = strata::find_free_port("127.0.0.1");
  EXPECT_GT(port, 0);
  EXPECT_LT(port, 65536);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << "port " << port;
  ::close(fd);
  EXPECT_CONTAINS(what_of([] { strata::find_free_port("no-such-host.invalid"); }), "no-such-host.invalid");
}

TEST(NetTest, LocalAddressTowardsAHostIsTheSourceTheKernelPicks) {
  // A loopback destination is reached from itself.
  EXPECT_EQ(strata::local_address_towards("127.0.0.1"), "127.0.0.1");
  // Another loopback address is reached from lo's primary one: still loopback.
  EXPECT_EQ(strata::local_address_towards("127.0.0.5").rfind("127.", 0), 0u);
  EXPECT_EQ(strata::local_address_towards("::1"), "::1");
  EXPECT_CONTAINS(what_of([] { strata::local_address_towards("no-such-host.invalid", "MASTER_ADDR"); }),
                  "cannot resolve MASTER_ADDR 'no-such-host.invalid'");
  // The network-namespace test (tests/launch/multi_node_test.cpp) checks it
  // across a veth link, where the answer is not loopback.
}

}  // namespace
