#include "daemons/coordinator/client_table.h"

#include <catch2/catch.hpp>

namespace capstan::coordinator {
namespace {

const kj::TimePoint kStart = kj::origin<kj::TimePoint>() + 1000 * kj::SECONDS;

kj::TimePoint at_ms(int64_t ms) { return kStart + ms * kj::MILLISECONDS; }

TEST_CASE("a retried schedule request finds the closure it scheduled, another client's does not",
          "[coordinator][clients]") {
  ClientTable clients(std::chrono::milliseconds(1000));
  clients.remember(7, 1, 41);
  clients.remember(7, 2, 42);
  CHECK(clients.find(7, 1) == std::optional<int64_t>(41));
  CHECK(clients.find(7, 2) == std::optional<int64_t>(42));
  CHECK_FALSE(clients.find(7, 3));
  CHECK_FALSE(clients.find(8, 1));
}

TEST_CASE("client 0 names nobody: its requests are not remembered and it never counts", "[coordinator][clients]") {
  ClientTable clients(std::chrono::milliseconds(1000));
  clients.remember(0, 1, 41);
  clients.seen(0, at_ms(0));
  CHECK_FALSE(clients.find(0, 1));
  CHECK(clients.size() == 0);
}

TEST_CASE("past kRememberedRequests a client's lowest request is forgotten", "[coordinator][clients]") {
  ClientTable clients(std::chrono::milliseconds(1000));
  const int64_t n = static_cast<int64_t>(ClientTable::kRememberedRequests);
  for (int64_t seq = 1; seq <= n + 1; ++seq) clients.remember(3, seq, 100 + seq);
  CHECK_FALSE(clients.find(3, 1));
  CHECK(clients.find(3, 2) == std::optional<int64_t>(102));
  CHECK(clients.find(3, n + 1) == std::optional<int64_t>(101 + n));
}

TEST_CASE("a client silent for the grace expires with its requests, one heard from since stays",
          "[coordinator][clients]") {
  ClientTable clients(std::chrono::milliseconds(1000));
  clients.seen(1, at_ms(0));
  clients.seen(2, at_ms(0));
  clients.remember(1, 5, 50);
  clients.remember(2, 5, 60);
  clients.seen(2, at_ms(600));
  CHECK(clients.expire(at_ms(999)).empty());
  CHECK(clients.expire(at_ms(1000)) == std::vector<uint64_t>{1});
  CHECK_FALSE(clients.find(1, 5));
  CHECK(clients.find(2, 5) == std::optional<int64_t>(60));
  CHECK(clients.size() == 1);
  CHECK(clients.expire(at_ms(1600)) == std::vector<uint64_t>{2});
  CHECK(clients.size() == 0);
}

TEST_CASE("with grace 0 clients are never tracked, and never expire", "[coordinator][clients]") {
  ClientTable clients(std::chrono::milliseconds(0));
  clients.seen(1, at_ms(0));
  clients.remember(1, 1, 10);
  CHECK(clients.size() == 0);
  CHECK(clients.expire(at_ms(1000000)).empty());
  CHECK(clients.find(1, 1) == std::optional<int64_t>(10));  // retries still answer the same closure
}

}  // namespace
}  // namespace capstan::coordinator
