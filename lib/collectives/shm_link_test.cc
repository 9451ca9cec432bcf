// The shared-memory link on its own: ring arithmetic across the wrap, the
// checks on opening, the name's removal, and a forked process streaming
// through it with both sides sleeping on their doorbells.
#include "collectives/shm_link.h"

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace capstan::collectives {
namespace {

std::vector<std::byte> pattern(size_t n, int seed) {
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>((i * 131 + static_cast<size_t>(seed) * 7) & 0xff);
  return out;
}

// Reads `n` bytes from `ring`, sleeping on `link`'s doorbell when empty.
std::vector<std::byte> read_all(ShmLink& link, ShmRing& ring, size_t n) {
  std::vector<std::byte> out;
  while (out.size() < n) {
    const uint32_t seen = link.sequence();
    auto span = ring.readable();
    if (span.empty()) {
      link.wait(seen, std::chrono::microseconds(200000));
      continue;
    }
    size_t take = std::min(span.size(), n - out.size());
    out.insert(out.end(), span.begin(), span.begin() + static_cast<std::ptrdiff_t>(take));
    ring.consume(take);
  }
  return out;
}

// Writes `data` into `ring` in 64-byte-multiple pieces, sleeping when full.
void write_all(ShmLink& link, ShmRing& ring, const std::vector<std::byte>& data, size_t piece) {
  size_t at = 0;
  while (at < data.size()) {
    const uint32_t seen = link.sequence();
    size_t room = ring.writable();
    if (room == 0) {
      link.wait(seen, std::chrono::microseconds(200000));
      continue;
    }
    size_t n = std::min({room, piece, data.size() - at});
    ring.append(data.data() + at, n);
    ring.publish();
    at += n;
  }
}

TEST_CASE("a ring carries bytes across its wrap, in order, in both directions", "[shm]") {
  auto a = ShmLink::create(4096).value();
  auto b = ShmLink::open(a->name(), a->token(), a->capacity()).value();
  a->unlink();
  REQUIRE(a->capacity() == 4096);
  CHECK(a->outgoing().writable() == 4096);
  CHECK(b->incoming().readable().empty());
  // 10 rounds of 1472 bytes through a 4096-byte ring: wraps several times.
  for (int round = 0; round < 10; ++round) {
    auto data = pattern(1472, round);
    a->outgoing().append(data.data(), 1024);
    a->outgoing().append(data.data() + 1024, 448);
    CHECK(b->incoming().readable().empty());  // not published yet
    a->outgoing().publish();
    std::vector<std::byte> got;
    while (got.size() < data.size()) {
      auto span = b->incoming().readable();
      REQUIRE_FALSE(span.empty());
      got.insert(got.end(), span.begin(), span.end());
      b->incoming().consume(span.size());
    }
    CHECK(got == data);
    CHECK(a->outgoing().writable() == 4096);
  }
  // The other direction, and skip() for padding.
  auto back = pattern(64, 9);
  b->outgoing().append(back.data(), 64);
  b->outgoing().skip(64);
  b->outgoing().publish();
  CHECK(a->incoming().readable().size() == 128);
  CHECK(std::memcmp(a->incoming().readable().data(), back.data(), 64) == 0);
  CHECK(b->outgoing().writable() == 4096 - 128);
}

TEST_CASE("opening checks the token and size, the name goes with unlink", "[shm]") {
  auto a = ShmLink::create(1 << 16).value();
  CHECK(ShmLink::open(a->name(), a->token() + 1, a->capacity()).status().code() == StatusCode::kNotFound);
  CHECK(ShmLink::open(a->name(), a->token(), a->capacity() * 2).status().code() == StatusCode::kNotFound);
  CHECK(ShmLink::open("/capstan-no-such-segment", 1, 1 << 16).status().code() == StatusCode::kNotFound);
  CHECK(ShmLink::open("../etc/passwd", 1, 1 << 16).status().code() == StatusCode::kInvalidArgument);
  CHECK(ShmLink::open(a->name(), a->token(), a->capacity()).ok());
  a->unlink();
  CHECK(ShmLink::open(a->name(), a->token(), a->capacity()).status().code() == StatusCode::kNotFound);
  // A link that was never opened by a peer leaves no name behind either.
  std::string name;
  {
    auto b = ShmLink::create(1 << 16).value();
    name = b->name();
  }
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  CHECK(fd < 0);
  if (fd >= 0) close(fd);
}

TEST_CASE("a segment /dev/shm has no room for fails at creation, not with SIGBUS later", "[shm]") {
  auto huge = ShmLink::create(size_t{1} << 50);
  REQUIRE_FALSE(huge.ok());
  CHECK((huge.status().code() == StatusCode::kResourceExhausted || huge.status().code() == StatusCode::kUnavailable));
}

TEST_CASE("a forked process streams 64 MiB each way through a 1 MiB link, sleeping on its doorbell", "[shm]") {
  auto link = ShmLink::create(1 << 20).value();
  const std::string name = link->name();
  const uint64_t token = link->token();
  const size_t bytes = size_t{64} << 20;
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto peer = ShmLink::open(name, token, 1 << 20);
    if (!peer.ok()) _exit(2);
    auto got = read_all(**peer, (*peer)->incoming(), bytes);
    if (got != pattern(bytes, 1)) _exit(3);
    write_all(**peer, (*peer)->outgoing(), pattern(bytes, 2), 192 << 10);
    _exit(0);
  }
  // Let the child start reading (and sleep) first.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  write_all(*link, link->outgoing(), pattern(bytes, 1), 64 << 10);
  auto back = read_all(*link, link->incoming(), bytes);
  link->unlink();
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(back == pattern(bytes, 2));
}

}  // namespace
}  // namespace capstan::collectives
