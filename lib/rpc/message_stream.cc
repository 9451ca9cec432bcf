#include "rpc/message_stream.h"

#include <kj/debug.h>

#include <cstdint>
#include <algorithm>
#include <map>
#include <vector>

#include "capstan/tensor.h"
#include "sync/mutex.h"

namespace capstan::rpc {
namespace {

// The live shareable buffers of received messages by address, so that a
// Data::Reader (which cannot name its message) finds the buffer it lies in.
// One per process: messages arrive on every loop thread, and a buffer leaves
// the index on whichever thread frees it.
class BufferIndex {
 public:
  // A fresh buffer of `bytes` in the index until its last holder lets go.
  std::shared_ptr<Tensor> allocate(size_t bytes) LOCKS_EXCLUDED(mu_) {
    auto tensor = Tensor::uninitialized(DType::kUInt8, Shape{static_cast<int64_t>(bytes)});
    KJ_REQUIRE(tensor.ok(), "cannot allocate a received message", bytes);
    std::shared_ptr<Tensor> buffer(new Tensor(std::move(*tensor)), [this](Tensor* t) {
      remove(t->data());
      delete t;
    });
    auto begin = reinterpret_cast<uintptr_t>(buffer->data());
    MutexLock lock(mu_);
    buffers_[begin] = Entry{begin + buffer->byte_size(), buffer};
    return buffer;
  }
  std::shared_ptr<void> holding(const void* begin, size_t size) LOCKS_EXCLUDED(mu_) {
    auto address = reinterpret_cast<uintptr_t>(begin);
    MutexLock lock(mu_);
    auto it = buffers_.upper_bound(address);
    if (it == buffers_.begin()) return nullptr;
    --it;
    if (address + size > it->second.end) return nullptr;
    return it->second.buffer.lock();  // null if it is being freed
  }

 private:
  void remove(const std::byte* data) LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    buffers_.erase(reinterpret_cast<uintptr_t>(data));
  }

  struct Entry {
    uintptr_t end;
    std::weak_ptr<Tensor> buffer;
  };
  Mutex mu_;
  std::map<uintptr_t, Entry> buffers_ GUARDED_BY(mu_);  // by first byte
};

// Never destroyed: a reader may go while static destructors run.
BufferIndex& buffer_index() {
  static BufferIndex* index = new BufferIndex;
  return *index;
}

// A received message: its segments in one buffer, either shareable (in the
// index) or a plain array.
class ReceivedMessage final : public capnp::MessageReader {
 public:
  ReceivedMessage(capnp::ReaderOptions options, kj::Array<kj::ArrayPtr<const capnp::word>> segments,
                  std::shared_ptr<Tensor> shared, kj::Array<capnp::word> owned)
      : capnp::MessageReader(options),
        segments_(kj::mv(segments)),
        shared_(std::move(shared)),
        owned_(kj::mv(owned)) {}

  kj::ArrayPtr<const capnp::word> getSegment(uint id) override {
    return id < segments_.size() ? segments_[id] : nullptr;
  }

 private:
  kj::Array<kj::ArrayPtr<const capnp::word>> segments_;
  std::shared_ptr<Tensor> shared_;
  kj::Array<capnp::word> owned_;
};

uint32_t little_endian(const kj::byte* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// The rest of a message once its segment sizes are known.
kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> read_segments(kj::AsyncIoStream& stream,
                                                                 capnp::ReaderOptions options,
                                                                 kj::Array<uint32_t> sizes) {
  uint64_t total_words = 0;
  for (uint32_t size : sizes) total_words += size;
  KJ_REQUIRE(total_words <= options.traversalLimitInWords,
             "Message is too large.  To increase the limit on the receiving end, see capnp::ReaderOptions.",
             total_words, options.traversalLimitInWords);
  const size_t bytes = total_words * sizeof(capnp::word);
  auto segments = kj::heapArrayBuilder<kj::ArrayPtr<const capnp::word>>(sizes.size());
  if (bytes < kShareableMessageBytes) {
    // Small: one array, one read.
    auto owned = kj::heapArray<capnp::word>(total_words);
    const capnp::word* next = owned.begin();
    for (uint32_t size : sizes) {
      segments.add(next, size);
      next += size;
    }
    capnp::word* words = owned.begin();
    return stream.read(words, bytes)
        .then([options, segments = segments.finish(), owned = kj::mv(owned)]() mutable
              -> kj::Maybe<capnp::MessageReaderAndFds> {
          kj::Own<capnp::MessageReader> reader =
              kj::heap<ReceivedMessage>(options, kj::mv(segments), nullptr, kj::mv(owned));
          return capnp::MessageReaderAndFds{kj::mv(reader), nullptr};
        });
  }
  // Shareable: each segment starts on a 64-byte boundary of the buffer (as
  // tensor buffers do), so a tensor's bytes, which a sender puts in a segment
  // of their own (tensor_codec.h), keep the alignment of a fresh tensor; the
  // segments are read one after another.
  constexpr size_t kAlign = 64;
  size_t offset = 0;
  std::vector<size_t> offsets;
  offsets.reserve(sizes.size());
  for (uint32_t size : sizes) {
    offsets.push_back(offset);
    offset = (offset + size * sizeof(capnp::word) + kAlign - 1) / kAlign * kAlign;
  }
  std::shared_ptr<Tensor> shared = buffer_index().allocate(std::max<size_t>(offset, 1));
  auto* base = reinterpret_cast<capnp::word*>(shared->mutable_data());  // 64-byte aligned
  kj::Promise<void> filled = kj::READY_NOW;
  for (size_t i = 0; i < sizes.size(); ++i) {
    capnp::word* start = base + offsets[i] / sizeof(capnp::word);
    segments.add(start, sizes[i]);
    size_t segment_bytes = size_t{sizes[i]} * sizeof(capnp::word);
    if (segment_bytes > 0) {
      filled = filled.then([&stream, start, segment_bytes]() { return stream.read(start, segment_bytes); });
    }
  }
  return filled.then([options, segments = segments.finish(), shared = std::move(shared)]() mutable
                     -> kj::Maybe<capnp::MessageReaderAndFds> {
    kj::Own<capnp::MessageReader> reader =
        kj::heap<ReceivedMessage>(options, kj::mv(segments), std::move(shared), nullptr);
    return capnp::MessageReaderAndFds{kj::mv(reader), nullptr};
  });
}

}  // namespace

MessageStream::MessageStream(kj::AsyncIoStream& stream) : stream_(stream), writer_(stream) {}

kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> MessageStream::tryReadMessage(
    kj::ArrayPtr<kj::AutoCloseFd> fd_space, capnp::ReaderOptions options, kj::ArrayPtr<capnp::word> scratch_space) {
  // Framing: segment count - 1 and the first segment's size (little-endian
  // 32-bit), the other segments' sizes, padding to a whole word, then the
  // segments.
  auto first = kj::heapArray<kj::byte>(8);
  kj::byte* first_bytes = first.begin();
  return stream_.tryRead(first_bytes, 8, 8)
      .then([this, options, first = kj::mv(first)](size_t n) mutable
            -> kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> {
        if (n == 0) return kj::Maybe<capnp::MessageReaderAndFds>(nullptr);
        KJ_REQUIRE(n == 8, "premature EOF");
        uint64_t count = uint64_t{little_endian(first.begin())} + 1;
        KJ_REQUIRE(count < 512, "Message has too many segments.", count);
        auto sizes = kj::heapArray<uint32_t>(count);
        sizes[0] = little_endian(first.begin() + 4);
        if (count == 1) return read_segments(stream_, options, kj::mv(sizes));
        // The other sizes and the padding: count - 1 values, rounded up to even.
        size_t rest = (count & ~uint64_t{1}) * sizeof(uint32_t);
        auto table = kj::heapArray<kj::byte>(rest);
        kj::byte* table_bytes = table.begin();
        return stream_.read(table_bytes, rest)
            .then([this, options, sizes = kj::mv(sizes), table = kj::mv(table)]() mutable {
              for (size_t i = 1; i < sizes.size(); ++i) sizes[i] = little_endian(table.begin() + (i - 1) * 4);
              return read_segments(stream_, options, kj::mv(sizes));
            });
      });
}

kj::Promise<void> MessageStream::writeMessage(kj::ArrayPtr<const int> fds,
                                              kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  return writer_.writeMessage(fds, segments);
}

kj::Promise<void> MessageStream::writeMessages(
    kj::ArrayPtr<kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>> messages) {
  return writer_.writeMessages(messages);
}

kj::Maybe<int> MessageStream::getSendBufferSize() { return writer_.getSendBufferSize(); }

kj::Promise<void> MessageStream::end() { return writer_.end(); }

capnp::ReaderOptions reader_options_for(uint64_t max_message_bytes) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = (max_message_bytes + kMessageFramingBytes) / sizeof(capnp::word);
  options.nestingLimit = 64;
  return options;
}

std::shared_ptr<void> received_buffer_holding(const void* begin, size_t size) {
  return buffer_index().holding(begin, size);
}

}  // namespace capstan::rpc
