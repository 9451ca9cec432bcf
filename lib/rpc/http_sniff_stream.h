// A client-side AsyncIoStream that notices when the peer speaks HTTP: a user
// who gives a daemon's HTTP port (/healthz, /metrics) where its RPC port
// belongs would otherwise see Cap'n Proto read "HTTP" as a segment count
// ("Message has too many segments") and retry until the deadline.
#ifndef CAPSTAN_LIB_RPC_HTTP_SNIFF_STREAM_H_
#define CAPSTAN_LIB_RPC_HTTP_SNIFF_STREAM_H_

#include <kj/async-io.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "async/status_exception.h"
#include "rpc/forwarding_stream.h"

namespace capstan::rpc {

class HttpSniffStream final : public ForwardingStream {
 public:
  HttpSniffStream(kj::Own<kj::AsyncIoStream> inner, std::string address)
      : ForwardingStream(kj::mv(inner)), address_(std::move(address)) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override {
    return inner().tryRead(buffer, min_bytes, max_bytes).then([this, buffer](size_t n) -> size_t {
      if (seen_ < sizeof(first_)) {
        size_t k = std::min(n, sizeof(first_) - seen_);
        std::memcpy(first_ + seen_, buffer, k);
        seen_ += k;
        if (seen_ == sizeof(first_) && std::memcmp(first_, "HTTP", 4) == 0) http_error();
      }
      return n;
    });
  }

  // An HTTP server answers the first bytes with an error page and closes:
  // a write after that fails (broken pipe) before anything was read, and
  // the answer may still wait in the socket. Said as HTTP when it is.
  kj::Promise<void> write(const void* buffer, size_t size) override {
    return or_http(inner().write(buffer, size));
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return or_http(inner().write(pieces));
  }

 private:
  [[noreturn]] void http_error() const {
    async::throw_status(Status::InvalidArgument(
        address_ + " answers HTTP: that is a daemon's HTTP port (/, /healthz, /readyz, /metrics); give its "
                   "RPC port (--port; the rpc_port line of its --port-file)"));
  }

  kj::Promise<void> or_http(kj::Promise<void> written) {
    return written.catch_([this](kj::Exception&& failed) -> kj::Promise<void> {
      if (seen_ > 0 || failed.getType() != kj::Exception::Type::DISCONNECTED) return kj::mv(failed);
      auto answer = kj::heapArray<kj::byte>(sizeof(first_));
      auto read = inner().tryRead(answer.begin(), answer.size(), answer.size());
      return read.then(
          [this, answer = kj::mv(answer), failed = kj::cp(failed)](size_t n) mutable -> kj::Promise<void> {
            if (n == answer.size() && std::memcmp(answer.begin(), "HTTP", 4) == 0) http_error();
            return kj::mv(failed);
          },
          [failed = kj::mv(failed)](kj::Exception&&) mutable -> kj::Promise<void> { return kj::mv(failed); });
    });
  }

  const std::string address_;
  char first_[4] = {};
  size_t seen_ = 0;
};

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_HTTP_SNIFF_STREAM_H_
