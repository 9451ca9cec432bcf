#include "rpc/message_stream.h"

#include <kj/debug.h>

#include <cstdint>
#include <cstring>
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

}  // namespace

MessageStream::MessageStream(kj::AsyncIoStream& stream)
    : stream_(stream), writer_(stream), buffer_(kj::heapArray<kj::byte>(kReadAheadBytes)) {}

kj::Promise<size_t> MessageStream::fill(size_t bytes) {
  KJ_ASSERT(bytes <= buffer_.size());
  if (end_ - begin_ >= bytes) return end_ - begin_;
  if (begin_ > 0) {
    std::memmove(buffer_.begin(), buffer_.begin() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  // tryRead returns fewer than the bytes asked for only at the end of the
  // stream.
  return stream_.tryRead(buffer_.begin() + end_, bytes - end_, buffer_.size() - end_).then([this](size_t n) {
    end_ += n;
    return end_ - begin_;
  });
}

size_t MessageStream::take(void* destination, size_t bytes) {
  size_t n = std::min(bytes, end_ - begin_);
  if (n > 0) std::memcpy(destination, buffer_.begin() + begin_, n);
  begin_ += n;
  return n;
}

kj::Promise<void> MessageStream::read_into(kj::byte* destination, size_t bytes) {
  size_t n = take(destination, bytes);
  if (n == bytes) return kj::READY_NOW;
  return stream_.read(destination + n, bytes - n);
}

kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> MessageStream::read_segments(capnp::ReaderOptions options,
                                                                                kj::Array<uint32_t> sizes) {
  uint64_t total_words = 0;
  for (uint32_t size : sizes) total_words += size;
  KJ_REQUIRE(total_words <= options.traversalLimitInWords,
             "Message is too large.  To increase the limit on the receiving end, see capnp::ReaderOptions.",
             total_words, options.traversalLimitInWords);
  const size_t bytes = total_words * sizeof(capnp::word);
  auto segments = kj::heapArrayBuilder<kj::ArrayPtr<const capnp::word>>(sizes.size());
  if (bytes < kShareableMessageBytes) {
    // Small: one array, one read (none when the read-ahead holds it all).
    auto owned = kj::heapArray<capnp::word>(total_words);
    const capnp::word* next = owned.begin();
    for (uint32_t size : sizes) {
      segments.add(next, size);
      next += size;
    }
    auto* words = reinterpret_cast<kj::byte*>(owned.begin());
    return read_into(words, bytes)
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
  // segments are read one after another, the read-ahead's bytes first.
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
    // What the read-ahead holds is copied now, in order; the rest is read
    // straight into place.
    size_t buffered = take(start, segment_bytes);
    if (buffered < segment_bytes) {
      auto* rest = reinterpret_cast<kj::byte*>(start) + buffered;
      filled = filled.then([this, rest, n = segment_bytes - buffered]() { return stream_.read(rest, n); });
    }
  }
  return filled.then([options, segments = segments.finish(), shared = std::move(shared)]() mutable
                     -> kj::Maybe<capnp::MessageReaderAndFds> {
    kj::Own<capnp::MessageReader> reader =
        kj::heap<ReceivedMessage>(options, kj::mv(segments), std::move(shared), nullptr);
    return capnp::MessageReaderAndFds{kj::mv(reader), nullptr};
  });
}

kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> MessageStream::tryReadMessage(
    kj::ArrayPtr<kj::AutoCloseFd> fd_space, capnp::ReaderOptions options, kj::ArrayPtr<capnp::word> scratch_space) {
  // Framing: segment count - 1 and the first segment's size (little-endian
  // 32-bit), the other segments' sizes, padding to a whole word, then the
  // segments. Each read asks for up to kReadAheadBytes, so small messages
  // that arrive together cost one read() between them.
  return fill(8).then([this, options](size_t available) mutable
                      -> kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> {
    if (available == 0) return kj::Maybe<capnp::MessageReaderAndFds>(nullptr);
    KJ_REQUIRE(available >= 8, "premature EOF");
    const kj::byte* first = buffer_.begin() + begin_;
    uint64_t count = uint64_t{little_endian(first)} + 1;
    KJ_REQUIRE(count < 512, "Message has too many segments.", count);
    // The other sizes and the padding: count - 1 values, rounded up to even.
    const size_t table = 8 + (count & ~uint64_t{1}) * sizeof(uint32_t);
    return fill(table).then([this, options, count, table](size_t available) {
      KJ_REQUIRE(available >= table, "premature EOF");
      const kj::byte* p = buffer_.begin() + begin_;
      auto sizes = kj::heapArray<uint32_t>(count);
      sizes[0] = little_endian(p + 4);
      for (size_t i = 1; i < count; ++i) sizes[i] = little_endian(p + 8 + (i - 1) * 4);
      begin_ += table;
      return read_segments(options, kj::mv(sizes));
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
