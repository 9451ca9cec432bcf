// Shared memory between a data worker and a consumer on the same host: the
// data service's fast path for large tensors (TF's target_workers="LOCAL"
// idea, made automatic). The worker writes each large tensor's bytes once
// into a region the consumer has mapped; the reply carries offsets; the
// consumer hands out tensors that point into the region (received in
// place) and gives each record back when the last copy of its tensor is
// dropped, on whatever thread that happens.
//
// Glossary:
//   region  - a memfd the worker creates for one consumer, sealed against
//             shrinking and growing (so neither side can make the other's
//             accesses fault), with a header page {magic, token, size}.
//   offer   - {pid, fd, token, size}: the consumer opens the worker's memfd
//             as /proc/<pid>/fd/<fd>, checks its size, seals and token, and
//             maps it. Only a process on the same host, in the same PID
//             namespace, allowed to read the worker's fds (same user) gets
//             there, and the random token tells the region apart from
//             anything else at that path: that is the locality check. A
//             consumer also sends its host's boot id first, so a worker
//             never creates a region for a consumer on another host.
//   record  - one tensor's bytes, after a 64-byte header whose first word
//             the consumer sets to 1 to release the record. Records are
//             allocated in a ring, in order; the worker reuses space from the
//             oldest record on, once it is released (a record held long
//             holds up the space after it: the worker then sends by TCP),
//             and goes back to the front as soon as the front has room for
//             the most that was in use lately, so the records in use stay
//             in as few (cache-warm) pages as they can.
//
// Trust: the consumer checks every offset and length a reply names against
// the mapping and the tensor's dtype and shape before touching a byte; the
// worker keeps its ring bookkeeping in its own memory and reads nothing
// from the region but the release words. A peer that writes into the region
// can only spoil the data of its own transfer.
//
// Cleanup: the memfd has no name; the worker closes its descriptor once the
// consumer has mapped the region (or after an idle timeout), and the pages
// go when the last mapping does, however either process ends.
//
// Example:
//   worker:   auto region = ShmRegion::create(64 << 20).value();  // offer pid, region->fd(), token, size
//   consumer: auto view = ShmView::open(pid, fd, token, size).value();
//   worker:   auto at = region->allocate(n);  memcpy(region->at(*at), bytes, n);  // reply: offset *at
//   consumer: Tensor t = view->tensor(DType::kFloat32, {n / 4}, *at, n).value();  // released with t
//
// Thread-safety: ShmRegion and ShmView are thread-safe.
#ifndef CAPSTAN_LIB_DATA_SHM_REGION_H_
#define CAPSTAN_LIB_DATA_SHM_REGION_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "sync/mutex.h"

namespace capstan::data::shm {

// Tensors smaller than this travel by TCP (the record bookkeeping and the
// release are not worth it).
inline constexpr size_t kMinTensorBytes = 64 * 1024;
// A region's size, rounded up to pages, is at least this and at most kMaxBytes.
inline constexpr size_t kMinBytes = 1 << 20;
inline constexpr size_t kMaxBytes = size_t{16} << 30;

// This host's /proc/sys/kernel/random/boot_id ("" where there is none).
const std::string& boot_id();

// The worker's side of one region.
class ShmRegion {
 public:
  // A new sealed memfd of `bytes` (clamped to [kMinBytes, kMaxBytes], rounded
  // up to pages). Unavailable where memfds or sealing are not supported.
  static Result<std::shared_ptr<ShmRegion>> create(size_t bytes);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  uint64_t token() const { return token_; }
  size_t size() const { return size_; }
  // The memfd, to offer; -1 once closed.
  int fd() const;
  // The consumer has mapped the region (or never will): the descriptor goes.
  void close_fd();

  // Room for `length` bytes: the offset of the record's data, or nullopt
  // while the region has no room (the caller sends by TCP).
  std::optional<uint64_t> allocate(size_t length);
  // Where the data at `offset` (from allocate) is written.
  std::byte* at(uint64_t offset) { return base_ + offset; }
  // Records not released yet (tests and metrics).
  size_t live_records();

 private:
  ShmRegion(int fd, std::byte* base, size_t size, uint64_t token);
  void reclaim() REQUIRES(mutex_);

  std::byte* const base_;
  const size_t size_;
  const uint64_t token_;
  mutable Mutex mutex_;
  int fd_ GUARDED_BY(mutex_);
  struct Record {
    uint64_t start;  // of the header
    uint64_t size;   // header, data and padding
    bool padding;    // the unused end of the ring before a wrap
  };
  std::deque<Record> live_ GUARDED_BY(mutex_);  // oldest first
  uint64_t head_ GUARDED_BY(mutex_);            // where the next record goes
  // The most bytes in use since the ring last went back to its front, and
  // in the round before: how much room the front must have to go back.
  uint64_t peak_ GUARDED_BY(mutex_) = 0;
  uint64_t last_peak_ GUARDED_BY(mutex_) = 0;
};

// The consumer's side of one region.
class ShmView : public std::enable_shared_from_this<ShmView> {
 public:
  // Opens and maps the region a worker offered. NotFound when it is not
  // reachable from here (another host or PID namespace, no permission, or
  // something else at that path); InvalidArgument for an offer that cannot
  // be right.
  static Result<std::shared_ptr<ShmView>> open(int64_t pid, int32_t fd, uint64_t token, uint64_t size);
  ~ShmView();
  ShmView(const ShmView&) = delete;
  ShmView& operator=(const ShmView&) = delete;

  uint64_t token() const { return token_; }
  size_t size() const { return size_; }

  // The tensor whose bytes are the record at [offset, offset + length): it
  // keeps this view mapped and releases the record when its last copy
  // goes. InvalidArgument (naming the values) for an offset or length
  // outside the region or off the record layout, a string dtype, or a
  // length that is not what dtype and shape need.
  Result<Tensor> tensor(DType dtype, const Shape& shape, uint64_t offset, uint64_t length);

 private:
  ShmView(std::byte* base, size_t size, uint64_t token) : base_(base), size_(size), token_(token) {}

  std::byte* const base_;
  const size_t size_;
  const uint64_t token_;
};

}  // namespace capstan::data::shm

#endif  // CAPSTAN_LIB_DATA_SHM_REGION_H_
