// Shared memory between two ranks on one host: the collectives' fast path
// where both processes can map the same pages (memcpy runs several times
// faster than loopback TCP here).
//
// A ShmLink is one POSIX shared-memory segment holding two byte rings, one
// per direction. Each ring has one producer and one consumer (single
// process each): the producer copies bytes in at `head`, the consumer reads
// them in place and releases them by advancing `tail`. Both counters only
// grow (bytes since the start); the ring position is counter % capacity.
// Everything written is a multiple of kAlign bytes and the capacity is too,
// so a reader never sees half an element at the wrap.
//
// Waiting: each side of a link has a doorbell, a futex word the other side
// bumps whenever it publishes bytes to it or releases room it wrote, so one
// sleep covers both directions. The other side makes the wake-up call only
// when a sleeper is registered, so a busy link makes no system calls.
// Futexes on a shared mapping work across processes.
//
// Setting up (connect_mesh, mesh.cc, does this over the TCP connection it
// already has to the peer):
//   creator: auto link = ShmLink::create(4 << 20).value();  send link->name(), link->token()
//   peer:    auto link = ShmLink::open(name, token, 4 << 20).value();  reply "ok"
//   creator: link->unlink();   // the name goes; both mappings stay
// If the peer cannot open the name (another host, another /dev/shm), the
// two ranks keep to TCP. The creator reserves the pages at creation, so a
// full /dev/shm fails there (ResourceExhausted) and not later with SIGBUS.
//
// Thread-safety: one thread produces into a ring and one consumes from it;
// the two may be in different processes.
#ifndef CAPSTAN_LIB_COLLECTIVES_SHM_LINK_H_
#define CAPSTAN_LIB_COLLECTIVES_SHM_LINK_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "capstan/status.h"

namespace capstan::collectives {

class ShmRing {
 public:
  static constexpr size_t kAlign = 64;

  // Producer side. Free bytes (a multiple of kAlign while every append is).
  size_t writable() const;
  // Copies `bytes` (<= writable()) after what was appended before.
  void append(const std::byte* data, size_t bytes);
  // Leaves `bytes` (<= writable()) unwritten: a record's padding.
  void skip(size_t bytes);
  // Makes everything appended or skipped visible to the consumer.
  void publish();

  // Consumer side. The bytes readable now, contiguous (up to the wrap).
  std::span<const std::byte> readable() const;
  // Releases `bytes` from the tail (<= readable().size()).
  void consume(size_t bytes);

  size_t capacity() const { return capacity_; }

  struct Control;
  struct Doorbell;
  // `peer` is the doorbell of the other side of the link: rung on publish
  // (for a ring this side writes) and on consume (for one it reads).
  ShmRing(Control* control, std::byte* data, size_t capacity, Doorbell* peer)
      : control_(control), data_(data), capacity_(capacity), peer_(peer) {}

 private:
  Control* const control_;
  std::byte* const data_;
  const size_t capacity_;
  Doorbell* const peer_;
  uint64_t pending_ = 0;  // producer only: appended or skipped, not published

};

class ShmLink {
 public:
  // A new segment with two rings of `capacity` bytes each (rounded up to a
  // multiple of the page size). Unavailable when shared memory cannot be
  // created here; ResourceExhausted when /dev/shm has no room for it.
  static Result<std::unique_ptr<ShmLink>> create(size_t capacity);
  // Maps the segment `name` that a peer created, checking that it carries
  // `token` and rings of `capacity` bytes (so a stale or foreign segment of
  // the same name is never used). NotFound when the name is not visible
  // here (the peer is on another host or another /dev/shm).
  static Result<std::unique_ptr<ShmLink>> open(const std::string& name, uint64_t token, size_t capacity);
  ~ShmLink();
  ShmLink(const ShmLink&) = delete;
  ShmLink& operator=(const ShmLink&) = delete;

  const std::string& name() const { return name_; }
  uint64_t token() const { return token_; }
  size_t capacity() const { return capacity_; }
  // Removes the segment's name once the peer has mapped it (or gave up): no
  // file is left in /dev/shm whatever happens to the processes afterwards.
  void unlink();

  // What this side writes, and what it reads.
  ShmRing& outgoing() { return *out_; }
  ShmRing& incoming() { return *in_; }

  // This side's doorbell: read it, re-check what to wait for, then wait()
  // sleeps until the other side rings it (or `timeout`, or a spurious wake:
  // callers re-check their condition).
  uint32_t sequence() const;
  void wait(uint32_t seen, std::chrono::microseconds timeout);
  // The same over several links at once (futex_waitv; where the kernel
  // lacks it, the first link only): returns when any of them rings.
  // `seen[i]` is links[i]->sequence() as read before the caller's check.
  static void wait_any(std::span<ShmLink* const> links, std::span<const uint32_t> seen,
                       std::chrono::microseconds timeout);

 private:
  ShmLink(std::string name, uint64_t token, size_t capacity, void* base, size_t mapped, bool creator);

  const std::string name_;
  const uint64_t token_;
  const size_t capacity_;
  void* const base_;
  const size_t mapped_;
  bool linked_;
  ShmRing::Doorbell* mine_ = nullptr;
  std::unique_ptr<ShmRing> out_, in_;
};

}  // namespace capstan::collectives

#endif  // CAPSTAN_LIB_COLLECTIVES_SHM_LINK_H_
