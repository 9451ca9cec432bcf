// The data service's shared-memory regions: a worker's ring of records and
// a consumer's view of it, in one process (the consumer opens the region
// through /proc/<pid>/fd as it would the worker's).
#include "data/shm_region.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

namespace capstan::data::shm {
namespace {

std::shared_ptr<ShmRegion> make_region(size_t bytes) {
  auto region = ShmRegion::create(bytes);
  REQUIRE(region.ok());
  return *region;
}

std::shared_ptr<ShmView> open_view(ShmRegion& region) {
  auto view = ShmView::open(getpid(), region.fd(), region.token(), region.size());
  REQUIRE(view.ok());
  return *view;
}

// Writes `n` floats valued `value` into a new record; its offset.
uint64_t put_floats(ShmRegion& region, size_t n, float value) {
  auto at = region.allocate(n * sizeof(float));
  REQUIRE(at.has_value());
  std::vector<float> values(n, value);
  std::memcpy(region.at(*at), values.data(), n * sizeof(float));
  return *at;
}

}  // namespace

TEST_CASE("a tensor written into a region is read in place and its record released when dropped",
          "[data][shm]") {
  auto region = make_region(4 << 20);
  auto view = open_view(*region);
  region->close_fd();  // the consumer mapped it: the descriptor is not needed any more
  CHECK(region->fd() == -1);
  uint64_t at = put_floats(*region, 1 << 16, 2.5f);
  {
    auto t = view->tensor(DType::kFloat32, {256, 256}, at, (1 << 16) * sizeof(float));
    REQUIRE(t.ok());
    CHECK(t->flat<float>()[0] == 2.5f);
    CHECK(t->flat<float>()[(1 << 16) - 1] == 2.5f);
    CHECK(reinterpret_cast<const std::byte*>(t->data()) != nullptr);
    CHECK(region->live_records() == 1);
    Tensor copy = *t;  // copies share the record
  }
  CHECK(region->live_records() == 0);
}

TEST_CASE("a region's records are released from any thread, and the mapping outlives the worker's side",
          "[data][shm]") {
  auto region = make_region(4 << 20);
  auto view = open_view(*region);
  uint64_t at = put_floats(*region, 1 << 16, 7.0f);
  auto t = view->tensor(DType::kFloat32, {1 << 16}, at, (1 << 16) * sizeof(float));
  REQUIRE(t.ok());
  view.reset();  // the tensor keeps the view
  std::thread other([held = std::move(*t)]() mutable { CHECK(held.flat<float>()[5] == 7.0f); });
  other.join();
  CHECK(region->live_records() == 0);

  at = put_floats(*region, 1 << 16, 9.0f);
  auto reopened = open_view(*region);
  auto kept = reopened->tensor(DType::kFloat32, {1 << 16}, at, (1 << 16) * sizeof(float));
  REQUIRE(kept.ok());
  region.reset();  // the worker went away
  CHECK(kept->flat<float>()[100] == 9.0f);
}

TEST_CASE("a full region refuses records until the oldest are released, then wraps", "[data][shm]") {
  auto region = make_region(1 << 20);  // one page of header, the rest for records
  auto view = open_view(*region);
  const size_t record = 200 * 1024;
  std::vector<Tensor> held;
  while (auto at = region->allocate(record)) {
    auto t = view->tensor(DType::kUInt8, {static_cast<int64_t>(record)}, *at, record);
    REQUIRE(t.ok());
    held.push_back(*t);
  }
  REQUIRE(held.size() == 5);  // (1 MiB - 4 KiB) / (200 KiB + 64)
  CHECK_FALSE(region->allocate(record).has_value());
  // A record released out of order frees nothing yet: the oldest holds the ring.
  held.erase(held.begin() + 2);
  CHECK_FALSE(region->allocate(record).has_value());
  held.erase(held.begin(), held.begin() + 2);  // the three oldest are free now
  auto again = region->allocate(record);  // at the start again
  REQUIRE(again.has_value());
  CHECK(*again < 4096 + 128);
  // Larger than the whole ring: never.
  CHECK_FALSE(region->allocate(2 << 20).has_value());
}

TEST_CASE("the ring goes back to its front once the front has room for the most in use lately, not only at its end",
          "[data][shm]") {
  auto region = make_region(4 << 20);  // room for 15 records of 256 KiB
  auto view = open_view(*region);
  const size_t record = 256 * 1024;
  const uint64_t slot = record + 64;  // with its header
  auto hold = [&](uint64_t at) {
    auto t = view->tensor(DType::kUInt8, {static_cast<int64_t>(record)}, at, record);
    REQUIRE(t.ok());
    return *t;
  };
  std::deque<Tensor> held;
  for (int i = 0; i < 4; ++i) held.push_back(hold(region->allocate(record).value()));  // 4 in use at most
  // Three released, one in use: the front's gap (3 records) would not hold
  // the 4 that were in use and the new one, so the next goes on at the end,
  // and so on while the oldest are released one by one.
  held.pop_front();
  held.pop_front();
  held.pop_front();
  for (int i = 4; i < 6; ++i) {
    auto at = region->allocate(record);
    REQUIRE(at.has_value());
    CHECK(*at == 4096 + i * slot + 64);
    held.push_back(hold(*at));
    held.pop_front();
  }
  // The oldest in use is the sixth: the front holds 5 records, back to it.
  auto again = region->allocate(record);
  REQUIRE(again.has_value());
  CHECK(*again == 4096 + 64);
  held.push_back(hold(*again));
  // The 3 after it fit there too while the sixth is still held: as many
  // in use as lately, and the new one (the room the wrap waited for). A
  // fifth would reach the sixth: no room, until it is released.
  for (int i = 1; i < 4; ++i) {
    auto next = region->allocate(record);
    REQUIRE(next.has_value());
    CHECK(*next == 4096 + i * slot + 64);
    held.push_back(hold(*next));
  }
  CHECK_FALSE(region->allocate(record).has_value());
  held.pop_front();
  auto after = region->allocate(record);
  REQUIRE(after.has_value());
  CHECK(*after == 4096 + 4 * slot + 64);
  held.push_back(hold(*after));
  // The records behind them stay intact and in order: released, the region
  // is empty again.
  held.clear();
  CHECK(region->live_records() == 0);
}

TEST_CASE("offsets and lengths a worker sends are checked against the region", "[data][shm]") {
  auto region = make_region(1 << 20);
  auto view = open_view(*region);
  const uint64_t size = region->size();
  uint64_t at = put_floats(*region, 1024, 1.0f);
  auto bad = [&](DType dtype, Shape shape, uint64_t offset, uint64_t length) {
    auto t = view->tensor(dtype, shape, offset, length);
    CHECK(t.status().code() == StatusCode::kInvalidArgument);
    return t.status().message();
  };
  CHECK_THAT(bad(DType::kFloat32, {1024}, size, 4096), Catch::Contains("past the region"));
  CHECK_THAT(bad(DType::kUInt8, {4096}, size - 64, 4096), Catch::Contains("past the region"));
  CHECK_THAT(bad(DType::kUInt8, {1}, UINT64_MAX - 63, 1), Catch::Contains("past the region"));
  CHECK_THAT(bad(DType::kUInt8, {16}, (UINT64_MAX / 2) & ~uint64_t{63}, UINT64_MAX / 2), Catch::Contains("past the region"));
  CHECK_THAT(bad(DType::kFloat32, {1024}, 0, 4096), Catch::Contains("header page"));
  CHECK_THAT(bad(DType::kFloat32, {1024}, at + 4, 4096), Catch::Contains("multiple of 64"));
  CHECK_THAT(bad(DType::kFloat32, {1025}, at, 4096), Catch::Contains("another length"));
  CHECK_THAT(bad(DType::kFloat32, {-1}, at, 4096), Catch::Contains("another length"));
  CHECK_THAT(bad(DType::kString, {1}, at, 4096), Catch::Contains("cannot travel"));
  CHECK(view->tensor(DType::kFloat32, {1024}, at, 4096).ok());
}

TEST_CASE("a consumer maps only the sealed region the worker offered", "[data][shm]") {
  auto region = make_region(1 << 20);
  auto wrong = ShmView::open(getpid(), region->fd(), region->token() + 1, region->size());
  CHECK(wrong.status().code() == StatusCode::kNotFound);
  CHECK_THAT(wrong.status().message(), Catch::Contains("another token"));
  CHECK(ShmView::open(getpid(), region->fd(), region->token(), region->size() + 4096).status().code() ==
        StatusCode::kNotFound);
  CHECK(ShmView::open(getpid(), 100000, region->token(), region->size()).status().code() == StatusCode::kNotFound);
  CHECK(ShmView::open(0, region->fd(), region->token(), region->size()).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(ShmView::open(getpid(), region->fd(), region->token(), 12345).status().code() ==
        StatusCode::kInvalidArgument);
  // An ordinary file of the right size, unsealed: a peer could shrink it
  // under us, so it is refused.
  char path[] = "/tmp/capstan-shm-test-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  unlink(path);
  REQUIRE(ftruncate(fd, static_cast<off_t>(region->size())) == 0);
  auto unsealed = ShmView::open(getpid(), fd, region->token(), region->size());
  CHECK(unsealed.status().code() == StatusCode::kNotFound);
  close(fd);
  CHECK_FALSE(boot_id().empty());
}

}  // namespace capstan::data::shm
