#include "data/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

namespace capstan::data::shm {
namespace {

constexpr uint64_t kMagic = 0x4e4f494745524453ull;  // "SDREGION"
constexpr size_t kPage = 4096;
constexpr uint64_t kRecordHeader = 64;  // the release word, then padding
constexpr uint64_t kAlign = 64;
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// The first page of a region.
struct Header {
  uint64_t magic;
  uint64_t token;
  uint64_t size;
};

uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// The release word of the record whose header is at `header`: plain memory
// shared with another process, so only ever touched atomically.
std::atomic_ref<uint32_t> release_word(std::byte* header) {
  return std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(header));
}

std::string errno_text() { return std::strerror(errno); }

// What a tensor handed out of a view owns: the mapping, and its record until
// the last copy of the tensor goes.
struct RecordHold {
  std::shared_ptr<ShmView> view;
  std::byte* header;
  ~RecordHold() { release_word(header).store(1, std::memory_order_release); }
};

}  // namespace

const std::string& boot_id() {
  static const std::string id = []() {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string line;
    std::getline(in, line);
    return line;
  }();
  return id;
}

// ---- ShmRegion (the worker's side) -------------------------------------------------

Result<std::shared_ptr<ShmRegion>> ShmRegion::create(size_t bytes) {
  static_assert(sizeof(Header) <= kPage);
  size_t size = round_up(std::clamp(bytes, kMinBytes, kMaxBytes), kPage);
  int fd = memfd_create("capstan-data-service", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::Unavailable("memfd_create for a shared-memory region: " + errno_text());
  if (ftruncate(fd, static_cast<off_t>(size)) != 0 || fcntl(fd, F_ADD_SEALS, kSeals) != 0) {
    Status error = Status::Unavailable("sizing and sealing a shared-memory region of " + std::to_string(size) +
                                       " bytes: " + errno_text());
    close(fd);
    return error;
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    Status error = Status::Unavailable("mapping a shared-memory region of " + std::to_string(size) +
                                       " bytes: " + errno_text());
    close(fd);
    return error;
  }
  std::random_device random;
  uint64_t token = 0;
  while (token == 0) token = (static_cast<uint64_t>(random()) << 32) ^ random();
  auto* header = static_cast<Header*>(base);
  header->token = token;
  header->size = size;
  std::atomic_ref<uint64_t>(header->magic).store(kMagic, std::memory_order_release);
  return std::shared_ptr<ShmRegion>(new ShmRegion(fd, static_cast<std::byte*>(base), size, token));
}

ShmRegion::ShmRegion(int fd, std::byte* base, size_t size, uint64_t token)
    : base_(base), size_(size), token_(token), fd_(fd), head_(kPage) {}

ShmRegion::~ShmRegion() {
  close_fd();
  munmap(base_, size_);
}

int ShmRegion::fd() const {
  MutexLock lock(mutex_);
  return fd_;
}

void ShmRegion::close_fd() {
  MutexLock lock(mutex_);
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void ShmRegion::reclaim() {
  while (!live_.empty() &&
         (live_.front().padding || release_word(base_ + live_.front().start).load(std::memory_order_acquire) != 0)) {
    live_.pop_front();
  }
}

std::optional<uint64_t> ShmRegion::allocate(size_t length) {
  const uint64_t need = kRecordHeader + round_up(length, kAlign);
  MutexLock lock(mutex_);
  if (need > size_ - kPage) return std::nullopt;
  reclaim();
  uint64_t start = 0;
  if (live_.empty()) {
    head_ = kPage;
    start = head_;
  } else {
    const uint64_t tail = live_.front().start;
    // In use: [tail, head_) when head_ > tail, else [tail, end) and
    // [kPage, head_). head_ == tail never happens with records live: a
    // record never fills the gap to the tail exactly.
    if (head_ > tail) {
      // Back to the front once it holds the most that was in use lately and
      // this record, not only at the end: the records then cycle through
      // about twice what the reader keeps in flight, which stays in the
      // CPU's caches for the worker's copy and the consumer's reads (1 MiB
      // copies into a 16 MiB window run twice as fast as into 128 MiB here).
      // Going back sooner leaves the next records only the front's gap
      // while the older ones are still held, and what does not fit goes by
      // TCP (with room for only what was in use at the moment, 1 tensor in
      // 9 did in data_service_bench).
      const bool end_fits = need <= size_ - head_;
      // (What is in use now is never more than peak_: records only went
      // since the last allocation measured it.)
      const uint64_t lately = std::max(peak_, last_peak_);
      if (need < tail - kPage && (!end_fits || tail - kPage >= lately + need)) {
        if (head_ < size_) live_.push_back(Record{head_, size_ - head_, true});
        start = kPage;
      } else if (end_fits) {
        start = head_;
      } else {
        return std::nullopt;
      }
    } else if (need < tail - head_) {
      start = head_;
    } else {
      return std::nullopt;
    }
  }
  if (start == kPage) {  // a new round through the ring
    last_peak_ = peak_;
    peak_ = 0;
  }
  release_word(base_ + start).store(0, std::memory_order_relaxed);
  live_.push_back(Record{start, need, false});
  head_ = start + need;
  const uint64_t tail = live_.front().start;
  peak_ = std::max(peak_, head_ > tail ? head_ - tail : (size_ - tail) + (head_ - kPage));
  return start + kRecordHeader;
}

size_t ShmRegion::live_records() {
  MutexLock lock(mutex_);
  reclaim();
  size_t n = 0;
  for (const Record& r : live_) n += r.padding ? 0 : 1;
  return n;
}

// ---- ShmView (the consumer's side) -------------------------------------------------

Result<std::shared_ptr<ShmView>> ShmView::open(int64_t pid, int32_t fd, uint64_t token, uint64_t size) {
  if (pid <= 0 || fd < 0 || token == 0 || size < kMinBytes || size > kMaxBytes || size % kPage != 0) {
    return Status::InvalidArgument("a shared-memory offer of pid " + std::to_string(pid) + ", fd " +
                                   std::to_string(fd) + ", " + std::to_string(size) +
                                   " bytes cannot be right (the size must be a multiple of " + std::to_string(kPage) +
                                   " in [" + std::to_string(kMinBytes) + ", " + std::to_string(kMaxBytes) + "])");
  }
  std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  int file = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (file < 0) return Status::NotFound("the data worker's shared memory " + path + " is not reachable here: " + errno_text());
  struct stat st {};
  int seals = fcntl(file, F_GET_SEALS);
  if (fstat(file, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != size ||
      seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    close(file);
    return Status::NotFound(path + " is not the data worker's sealed region of " + std::to_string(size) + " bytes");
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, file, 0);
  close(file);
  if (base == MAP_FAILED) return Status::NotFound("mapping the data worker's shared memory " + path + ": " + errno_text());
  const auto* header = static_cast<const Header*>(base);
  if (std::atomic_ref<uint64_t>(const_cast<uint64_t&>(header->magic)).load(std::memory_order_acquire) != kMagic ||
      header->token != token || header->size != size) {
    munmap(base, size);
    return Status::NotFound(path + " is not the region the data worker offered (another token)");
  }
  return std::shared_ptr<ShmView>(new ShmView(static_cast<std::byte*>(base), size, token));
}

ShmView::~ShmView() { munmap(base_, size_); }

Result<Tensor> ShmView::tensor(DType dtype, const Shape& shape, uint64_t offset, uint64_t length) {
  auto invalid = [&](const std::string& why) {
    return Status::InvalidArgument("a shared-memory tensor at offset " + std::to_string(offset) + ", length " +
                                   std::to_string(length) + " (region of " + std::to_string(size_) +
                                   " bytes): " + why);
  };
  if (offset < kPage + kRecordHeader || offset % kAlign != 0) {
    return invalid("the offset is not a record's data (past the header page, a multiple of 64)");
  }
  if (offset > size_ || length > size_ - offset) return invalid("it ends past the region");
  if (dtype == DType::kString || dtype_size(dtype) == 0) {
    return invalid("dtype " + std::to_string(static_cast<int>(dtype)) + " cannot travel in shared memory");
  }
  int64_t n = shape_num_elements(shape);
  if (n < 0 || static_cast<uint64_t>(n) > length || static_cast<uint64_t>(n) * dtype_size(dtype) != length) {
    return invalid("shape " + shape_string(shape) + " of " + std::string(dtype_name(dtype)) + " needs another length");
  }
  auto hold = std::make_shared<RecordHold>();
  hold->view = shared_from_this();
  hold->header = base_ + offset - kRecordHeader;
  return Tensor::from_buffer(dtype, shape, std::move(hold), base_ + offset, static_cast<size_t>(length));
}

}  // namespace capstan::data::shm
