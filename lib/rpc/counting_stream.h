// An AsyncIoStream that forwards to another and counts the bytes that pass,
// for the bytes-in/bytes-out metrics.
#ifndef CAPSTAN_LIB_RPC_COUNTING_STREAM_H_
#define CAPSTAN_LIB_RPC_COUNTING_STREAM_H_

#include <kj/async-io.h>

#include <functional>

#include "rpc/forwarding_stream.h"

namespace capstan::rpc {

class CountingStream final : public ForwardingStream {
 public:
  using Counter = std::function<void(size_t)>;
  // Either counter may be empty.
  CountingStream(kj::Own<kj::AsyncIoStream> inner, Counter on_read, Counter on_write)
      : ForwardingStream(kj::mv(inner)), on_read_(std::move(on_read)), on_write_(std::move(on_write)) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override {
    return inner().tryRead(buffer, min_bytes, max_bytes).then([this](size_t n) {
      if (on_read_) on_read_(n);
      return n;
    });
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    if (on_write_) on_write_(size);
    return inner().write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    if (on_write_) {
      size_t total = 0;
      for (auto& piece : pieces) total += piece.size();
      on_write_(total);
    }
    return inner().write(pieces);
  }

 private:
  Counter on_read_;
  Counter on_write_;
};

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_COUNTING_STREAM_H_
