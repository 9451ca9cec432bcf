// Test helpers: a collective group whose ranks are threads of this process,
// and running a function on every rank at once.
#ifndef CAPSTAN_LIB_COLLECTIVES_TEST_GROUP_H_
#define CAPSTAN_LIB_COLLECTIVES_TEST_GROUP_H_

#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "capstan/collectives.h"

namespace capstan::testing {

using Group = std::vector<std::unique_ptr<Communicator>>;

inline Group make_group(int n, CollectiveOptions options = {}, int64_t generation = 1) {
  std::vector<std::unique_ptr<CollectiveEndpoint>> endpoints;
  std::vector<std::string> addresses;
  for (int i = 0; i < n; ++i) {
    endpoints.push_back(CollectiveEndpoint::listen().value());
    addresses.push_back(endpoints.back()->address());
  }
  std::vector<std::optional<Result<std::unique_ptr<Communicator>>>> made(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i]() {
      made[static_cast<size_t>(i)].emplace(Communicator::create(std::move(endpoints[static_cast<size_t>(i)]),
                                                                addresses, i, generation, options));
    });
  }
  for (auto& t : threads) t.join();
  Group group;
  for (auto& m : made) {
    REQUIRE(m->ok());
    group.push_back(std::move(**m));
  }
  return group;
}

// Runs fn(rank) on every rank at once; returns what each returned (Catch's
// assertions are not thread-safe: check the results afterwards).
template <typename T>
std::vector<T> on_all(int n, const std::function<T(int)>& fn) {
  std::vector<std::optional<T>> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r]() { out[static_cast<size_t>(r)].emplace(fn(r)); });
  for (auto& t : threads) t.join();
  std::vector<T> results;
  for (auto& o : out) results.push_back(std::move(*o));
  return results;
}

}  // namespace capstan::testing

#endif  // CAPSTAN_LIB_COLLECTIVES_TEST_GROUP_H_
