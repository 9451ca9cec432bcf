// An AsyncIoStream that forwards to another and counts the bytes that pass,
// for the bytes-in/bytes-out metrics.
#ifndef CAPSTAN_SDK_SRC_RPC_COUNTING_STREAM_H_
#define CAPSTAN_SDK_SRC_RPC_COUNTING_STREAM_H_

#include <kj/async-io.h>

#include <functional>

namespace capstan::rpc {

class CountingStream final : public kj::AsyncIoStream {
 public:
  using Counter = std::function<void(size_t)>;
  // Either counter may be empty.
  CountingStream(kj::Own<kj::AsyncIoStream> inner, Counter on_read, Counter on_write)
      : inner_(kj::mv(inner)), on_read_(std::move(on_read)), on_write_(std::move(on_write)) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override {
    return inner_->tryRead(buffer, min_bytes, max_bytes).then([this](size_t n) {
      if (on_read_) on_read_(n);
      return n;
    });
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    if (on_write_) on_write_(size);
    return inner_->write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    if (on_write_) {
      size_t total = 0;
      for (auto& piece : pieces) total += piece.size();
      on_write_(total);
    }
    return inner_->write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override { inner_->shutdownWrite(); }
  void abortRead() override { inner_->abortRead(); }
  void getsockopt(int level, int option, void* value, kj::uint* length) override {
    inner_->getsockopt(level, option, value, length);
  }
  void setsockopt(int level, int option, const void* value, kj::uint length) override {
    inner_->setsockopt(level, option, value, length);
  }
  void getsockname(struct sockaddr* addr, kj::uint* length) override {
    inner_->getsockname(addr, length);
  }
  void getpeername(struct sockaddr* addr, kj::uint* length) override {
    inner_->getpeername(addr, length);
  }

 private:
  kj::Own<kj::AsyncIoStream> inner_;
  Counter on_read_;
  Counter on_write_;
};

}  // namespace capstan::rpc

#endif  // CAPSTAN_SDK_SRC_RPC_COUNTING_STREAM_H_
