#include "collectives/shm_link.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

namespace capstan::collectives {
namespace {

constexpr uint64_t kSegmentMagic = 0x4b4e494c4d485343ull;  // "CSHMLINK"
constexpr size_t kPage = 4096;

// At the start of the segment.
struct SegmentHeader {
  uint64_t magic;
  uint64_t token;
  uint64_t capacity;
};

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// [header][ring 0 control][ring 1 control][doorbell 0][doorbell 1] in the
// first page, then ring 0's data and ring 1's.
constexpr size_t kControlOffset = 256;

}  // namespace

// One ring's counters, each on its own cache line (the producer writes
// head, the consumer tail). Accessed through std::atomic_ref: the memory
// is shared with another process, and only plain integers live in it.
struct ShmRing::Control {
  alignas(64) uint64_t head;  // bytes published by the producer
  alignas(64) uint64_t tail;  // bytes released by the consumer
};

// One side's: the other side bumps `sequence` on every change it makes.
struct ShmRing::Doorbell {
  alignas(64) uint32_t sequence;  // futex word
  uint32_t waiters;               // threads of this side sleeping on it
};

namespace {

using Control = ShmRing::Control;

uint64_t load(const uint64_t& v) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(v)).load(std::memory_order_acquire);
}

long futex(uint32_t* word, int op, uint32_t value, const struct timespec* timeout) {
  return syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}

// The counter moves before the bump (seq_cst), and a sleeper registers
// before it re-checks its condition (seq_cst): either the sleeper sees the
// new counter, or this side sees the sleeper and wakes it.
void ring(ShmRing::Doorbell* bell) {
  std::atomic_ref<uint32_t>(bell->sequence).fetch_add(1, std::memory_order_seq_cst);
  if (std::atomic_ref<uint32_t>(bell->waiters).load(std::memory_order_seq_cst) != 0) {
    futex(&bell->sequence, FUTEX_WAKE, INT32_MAX, nullptr);
  }
}

}  // namespace

size_t ShmRing::writable() const {
  const uint64_t used = load(control_->head) + pending_ - load(control_->tail);
  return capacity_ - static_cast<size_t>(used);
}

void ShmRing::append(const std::byte* data, size_t bytes) {
  size_t at = static_cast<size_t>((load(control_->head) + pending_) % capacity_);
  size_t first = std::min(bytes, capacity_ - at);
  std::memcpy(data_ + at, data, first);
  if (first < bytes) std::memcpy(data_, data + first, bytes - first);
  pending_ += bytes;
}

void ShmRing::skip(size_t bytes) { pending_ += bytes; }

void ShmRing::publish() {
  if (pending_ == 0) return;
  std::atomic_ref<uint64_t>(control_->head).store(load(control_->head) + pending_, std::memory_order_seq_cst);
  pending_ = 0;
  ring(peer_);
}

std::span<const std::byte> ShmRing::readable() const {
  const uint64_t tail = load(control_->tail);
  const uint64_t head = load(control_->head);
  const size_t at = static_cast<size_t>(tail % capacity_);
  const size_t bytes = std::min(static_cast<size_t>(head - tail), capacity_ - at);
  return {data_ + at, bytes};
}

void ShmRing::consume(size_t bytes) {
  if (bytes == 0) return;
  std::atomic_ref<uint64_t>(control_->tail).store(load(control_->tail) + bytes, std::memory_order_seq_cst);
  ring(peer_);
}

uint32_t ShmLink::sequence() const {
  return std::atomic_ref<uint32_t>(mine_->sequence).load(std::memory_order_seq_cst);
}

void ShmLink::wait(uint32_t seen, std::chrono::microseconds timeout) {
  std::atomic_ref<uint32_t> waiters(mine_->waiters);
  waiters.fetch_add(1, std::memory_order_seq_cst);
  if (sequence() == seen) {
    struct timespec ts;
    ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
    ts.tv_nsec = static_cast<long>(timeout.count() % 1000000) * 1000;
    futex(&mine_->sequence, FUTEX_WAIT, seen, &ts);
  }
  waiters.fetch_sub(1, std::memory_order_seq_cst);
}

void ShmLink::wait_any(std::span<ShmLink* const> links, std::span<const uint32_t> seen,
                       std::chrono::microseconds timeout) {
  if (links.empty()) return;
  if (links.size() == 1) return links[0]->wait(seen[0], timeout);
  constexpr size_t kMax = 128;  // the kernel's FUTEX_WAITV_MAX
  const size_t n = std::min(links.size(), kMax);
  for (size_t i = 0; i < n; ++i) {
    std::atomic_ref<uint32_t>(links[i]->mine_->waiters).fetch_add(1, std::memory_order_seq_cst);
  }
  bool moved = false;
  for (size_t i = 0; i < n && !moved; ++i) moved = links[i]->sequence() != seen[i];
  static std::atomic<bool> no_waitv{false};
  if (!moved) {
    struct futex_waitv waiters[kMax] = {};
    for (size_t i = 0; i < n; ++i) {
      waiters[i].val = seen[i];
      waiters[i].uaddr = reinterpret_cast<uint64_t>(&links[i]->mine_->sequence);
      waiters[i].flags = FUTEX_32;  // shared: the other side is another process
    }
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    const int64_t ns = until.tv_nsec + static_cast<int64_t>(timeout.count()) * 1000;
    until.tv_sec += static_cast<time_t>(ns / 1000000000);
    until.tv_nsec = static_cast<long>(ns % 1000000000);
    if (no_waitv.load(std::memory_order_relaxed) ||
        (syscall(SYS_futex_waitv, waiters, static_cast<unsigned>(n), 0, &until, CLOCK_MONOTONIC) < 0 &&
         errno == ENOSYS)) {
      no_waitv.store(true, std::memory_order_relaxed);
      // An older kernel: the first link, briefly (the others are looked at
      // again when it returns).
      struct timespec brief{0, 50000};
      futex(&links[0]->mine_->sequence, FUTEX_WAIT, seen[0], &brief);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    std::atomic_ref<uint32_t>(links[i]->mine_->waiters).fetch_sub(1, std::memory_order_seq_cst);
  }
}

// ---- ShmLink ---------------------------------------------------------------------------

ShmLink::ShmLink(std::string name, uint64_t token, size_t capacity, void* base, size_t mapped, bool creator)
    : name_(std::move(name)), token_(token), capacity_(capacity), base_(base), mapped_(mapped), linked_(creator) {
  auto* bytes = static_cast<std::byte*>(base);
  auto* c0 = reinterpret_cast<Control*>(bytes + kControlOffset);
  auto* c1 = reinterpret_cast<Control*>(bytes + kControlOffset + sizeof(Control));
  auto* bell0 = reinterpret_cast<ShmRing::Doorbell*>(bytes + kControlOffset + 2 * sizeof(Control));
  auto* bell1 = bell0 + 1;
  std::byte* d0 = bytes + kPage;
  std::byte* d1 = d0 + capacity;
  // The creator writes ring 0 and rings doorbell 1; the peer writes ring 1
  // and rings doorbell 0.
  ShmRing::Doorbell* theirs = creator ? bell1 : bell0;
  mine_ = creator ? bell0 : bell1;
  auto ring0 = std::make_unique<ShmRing>(c0, d0, capacity, theirs);
  auto ring1 = std::make_unique<ShmRing>(c1, d1, capacity, theirs);
  out_ = creator ? std::move(ring0) : std::move(ring1);
  in_ = creator ? std::move(ring1) : std::move(ring0);
}

ShmLink::~ShmLink() {
  unlink();
  munmap(base_, mapped_);
}

void ShmLink::unlink() {
  if (!linked_) return;
  linked_ = false;
  shm_unlink(name_.c_str());
}

Result<std::unique_ptr<ShmLink>> ShmLink::create(size_t capacity) {
  static_assert(sizeof(SegmentHeader) <= kControlOffset);
  static_assert(kControlOffset + 2 * sizeof(Control) + 2 * sizeof(ShmRing::Doorbell) <= kPage);
  capacity = round_up(std::max<size_t>(capacity, kPage), kPage);
  const size_t mapped = kPage + 2 * capacity;
  std::random_device random;
  const uint64_t token = (static_cast<uint64_t>(random()) << 32) ^ random();
  static std::atomic<uint64_t> counter{0};
  std::string name = "/capstan-" + std::to_string(getpid()) + "-" + std::to_string(counter.fetch_add(1)) + "-" +
                     std::to_string(token % 1000000007ull);
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    return Status::Unavailable("creating shared memory " + name + ": " + std::strerror(errno));
  }
  // Reserve the pages now: on a full /dev/shm a sparse segment would
  // SIGBUS at the first write instead of failing here.
  int err = ftruncate(fd, static_cast<off_t>(mapped)) == 0 ? posix_fallocate(fd, 0, static_cast<off_t>(mapped)) : errno;
  if (err != 0) {
    close(fd);
    shm_unlink(name.c_str());
    return Status::ResourceExhausted("reserving " + std::to_string(mapped >> 20) + " MiB of shared memory (" + name +
                                     ") for a collective link: " + std::strerror(err) +
                                     "; give /dev/shm more room (docker: --shm-size) or set the transport to tcp");
  }
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return Status::Unavailable("mapping shared memory " + name + ": " + std::strerror(errno));
  }
  // Fresh tmpfs pages are zero: counters start at 0.
  auto* header = static_cast<SegmentHeader*>(base);
  header->token = token;
  header->capacity = capacity;
  std::atomic_ref<uint64_t>(header->magic).store(kSegmentMagic, std::memory_order_release);
  return std::unique_ptr<ShmLink>(new ShmLink(std::move(name), token, capacity, base, mapped, true));
}

Result<std::unique_ptr<ShmLink>> ShmLink::open(const std::string& name, uint64_t token, size_t capacity) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos || name.size() > 200) {
    return Status::InvalidArgument("'" + name + "' is not a shared-memory name");
  }
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return Status::NotFound("shared memory " + name + " is not visible here: " + std::strerror(errno));
  struct stat st {};
  const size_t mapped = kPage + 2 * capacity;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != mapped || capacity % kPage != 0) {
    close(fd);
    return Status::NotFound("shared memory " + name + " has another size than the peer announced");
  }
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return Status::Unavailable("mapping shared memory " + name + ": " + std::strerror(errno));
  const auto* header = static_cast<SegmentHeader*>(base);
  if (std::atomic_ref<uint64_t>(const_cast<uint64_t&>(header->magic)).load(std::memory_order_acquire) !=
          kSegmentMagic ||
      header->token != token || header->capacity != capacity) {
    munmap(base, mapped);
    return Status::NotFound("shared memory " + name + " is not the peer's (another token)");
  }
  return std::unique_ptr<ShmLink>(new ShmLink(name, token, capacity, base, mapped, false));
}

}  // namespace capstan::collectives
