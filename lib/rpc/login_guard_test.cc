#include "rpc/login_guard.h"

#include <catch2/catch.hpp>

namespace capstan::rpc {
namespace {

TEST_CASE("pre-login caps leave a reserve and half the rest of the open-file limit", "[rpc][login]") {
  // ulimit -n 64: 32 reserved, 16 of the other 32 for strangers, 8 per host.
  PreLoginCaps caps = derive_pre_login_caps(64, 1024, 256);
  CHECK(caps.overall == 16);
  CHECK(caps.per_host == 8);
  CHECK(caps.fd_limit == 64);
  CHECK(caps.lowered);
  // 1024 (a common default): a quarter reserved, 384 and 192.
  caps = derive_pre_login_caps(1024, 1024, 256);
  CHECK(caps.overall == 384);
  CHECK(caps.per_host == 192);
  CHECK(caps.lowered);
  // Whatever the limit, strangers never hold more than half of it.
  for (uint64_t limit : {1u, 8u, 33u, 40u, 64u, 100u, 256u, 1000u, 4096u, 65536u}) {
    INFO("limit " << limit);
    caps = derive_pre_login_caps(limit, 1024, 256);
    CHECK(caps.overall >= 1);
    CHECK(caps.per_host >= 1);
    CHECK(caps.per_host <= caps.overall);
    if (limit >= 2 * kMinReservedDescriptors) CHECK(static_cast<uint64_t>(caps.overall) <= limit / 2);
  }
}

TEST_CASE("a high or unlimited open-file limit keeps the configured pre-login caps", "[rpc][login]") {
  for (uint64_t limit : {uint64_t{0}, uint64_t{65536}, uint64_t{1} << 20, ~uint64_t{0}}) {
    INFO("limit " << limit);
    PreLoginCaps caps = derive_pre_login_caps(limit, 1024, 256);
    CHECK(caps.overall == 1024);
    CHECK(caps.per_host == 256);
    CHECK_FALSE(caps.lowered);
  }
  // Configured lower than the limit allows: kept as they are.
  PreLoginCaps caps = derive_pre_login_caps(1024, 10, 4);
  CHECK(caps.overall == 10);
  CHECK(caps.per_host == 4);
  CHECK_FALSE(caps.lowered);
}

TEST_CASE("a per-host pre-login cap above the overall cap is the overall cap", "[rpc][login]") {
  PreLoginCaps caps = derive_pre_login_caps(0, 10, 256);
  CHECK(caps.overall == 10);
  CHECK(caps.per_host == 10);
}

TEST_CASE("a tiny open-file limit still admits one waiting connection", "[rpc][login]") {
  PreLoginCaps caps = derive_pre_login_caps(20, 1024, 256);
  CHECK(caps.overall == 1);
  CHECK(caps.per_host == 1);
}

TEST_CASE("the open-file limit of this process is read", "[rpc][login]") {
  // 0 only when unlimited; a test process always has some descriptors.
  const uint64_t limit = open_file_limit();
  CHECK((limit == 0 || limit >= 3));
}

PreLoginCaps caps_of(int overall, int per_host) {
  PreLoginCaps caps;
  caps.overall = overall;
  caps.per_host = per_host;
  return caps;
}

TEST_CASE("at the per-host cap the host's oldest waiting connection is evicted", "[rpc][login]") {
  LoginCaps caps(caps_of(10, 2));
  auto other = caps.admit("10.0.0.9");
  auto a = caps.admit("10.0.0.1");
  auto b = caps.admit("10.0.0.1");
  CHECK_FALSE(a.evicted);
  CHECK_FALSE(b.evicted);
  auto c = caps.admit("10.0.0.1");
  REQUIRE(c.evicted);
  CHECK(*c.evicted == a.ticket);  // not `other`, older but from another host
  CHECK(caps.waiting_from("10.0.0.1") == 2);
  CHECK(caps.waiting() == 3);
  // The evicted one's release (when its connection goes) changes nothing.
  caps.release(a.ticket);
  CHECK(caps.waiting() == 3);
  caps.release(other.ticket);
  CHECK(caps.waiting_from("10.0.0.9") == 0);
  CHECK(caps.waiting() == 2);
}

TEST_CASE("at the overall cap the oldest waiting connection of any host is evicted", "[rpc][login]") {
  LoginCaps caps(caps_of(3, 2));
  auto a = caps.admit("10.0.0.1");
  auto b = caps.admit("10.0.0.2");
  auto c = caps.admit("10.0.0.3");
  auto d = caps.admit("10.0.0.4");
  REQUIRE(d.evicted);
  CHECK(*d.evicted == a.ticket);
  CHECK(caps.waiting() == 3);
  CHECK(caps.waiting_from("10.0.0.1") == 0);
  // A login (release) frees a slot: the next one evicts nothing.
  caps.release(b.ticket);
  auto e = caps.admit("10.0.0.5");
  CHECK_FALSE(e.evicted);
  CHECK(caps.waiting() == 3);
  CHECK(c.ticket != e.ticket);
}

TEST_CASE("a flood of waiting connections never holds more than the caps", "[rpc][login]") {
  LoginCaps caps(caps_of(16, 8));
  std::vector<LoginCaps::Ticket> evicted;
  for (int i = 0; i < 1000; ++i) {
    auto admission = caps.admit(i % 3 == 0 ? "10.0.0.1" : "10.0.0.2");
    if (admission.evicted) evicted.push_back(*admission.evicted);
    CHECK(caps.waiting() <= 16);
    CHECK(caps.waiting_from("10.0.0.1") <= 8);
    CHECK(caps.waiting_from("10.0.0.2") <= 8);
  }
  CHECK(evicted.size() == 1000 - 16);
  // The newest connection, a client that logs in at once, is never the one
  // evicted: each eviction names an older ticket.
  for (size_t i = 1; i < evicted.size(); ++i) CHECK(evicted[i] != evicted[i - 1]);
}

TEST_CASE("a login state leaves the count once, at login or when it goes", "[rpc][login]") {
  LoginCaps caps(caps_of(4, 4));
  {
    LoginState state(caps, caps.admit("h").ticket);
    CHECK(caps.waiting() == 1);
    state.logged_in_now();
    CHECK(state.logged_in());
    CHECK(caps.waiting() == 0);
    auto other = caps.admit("h");
    CHECK(caps.waiting() == 1);
    state.leave_waiting();  // again: `other` still counts
    CHECK(caps.waiting() == 1);
    caps.release(other.ticket);
  }
  {
    LoginState state(caps, caps.admit("h").ticket);
    CHECK(caps.waiting() == 1);
  }
  CHECK(caps.waiting() == 0);
}

}  // namespace
}  // namespace capstan::rpc
