// The transport floor the benches put beside their transfers: raw loopback
// TCP between two threads (only for benches that link capstan_runtime: it
// tunes its sockets as Capstan's links are tuned, rpc/link_timeout.h).
#ifndef CAPSTAN_BENCH_LOOPBACK_TCP_H_
#define CAPSTAN_BENCH_LOOPBACK_TCP_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "capstan/tensor.h"
#include "rpc/link_timeout.h"

namespace capstan::bench {

struct LoopbackRun {
  int64_t messages = 0;  // received whole
  int64_t bytes = 0;
  double seconds = 0;
  double gb_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

// The transport floor: `count` messages of `size` bytes through one loopback
// TCP connection, written by another thread in send()s of at most 1 MiB
// walking through a source buffer of `size` bytes (as a transfer reads its
// tensor), and each read into a fresh tensor of `size` bytes (the copies a
// received buffer needs at least: one into the socket, one out of it). Timed
// from the accepted connection to the last byte. Both sockets get the
// congestion control Capstan's loopback links use (rpc/link_timeout.h).
inline LoopbackRun loopback_tcp(int64_t count, size_t size) {
  const size_t kSendSize = 1 << 20;
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 || getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    fail("loopback socket", Status::Internal(std::strerror(errno)));
  }
  // Filled (its pages faulted in) before the clock starts.
  std::vector<char> source(size, 1);
  std::thread sender([addr, count, size, kSendSize, &source]() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return;
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd);
      return;
    }
    rpc::tune_loopback_socket(fd);  // as Capstan's own loopback links
    for (int64_t i = 0; i < count; ++i) {
      size_t sent = 0;
      while (sent < size) {
        ssize_t n = send(fd, source.data() + sent, std::min(kSendSize, size - sent), 0);
        if (n <= 0) break;
        sent += static_cast<size_t>(n);
      }
    }
    close(fd);
  });
  int fd = accept(listener, nullptr, nullptr);
  if (fd >= 0) rpc::tune_loopback_socket(fd);
  // One buffer allocated and freed before the clock starts: the later ones
  // come from the tensor buffer cache, as warmed-up transfers' buffers do.
  if (auto warm = Tensor::uninitialized(DType::kUInt8, {static_cast<int64_t>(size)}); !warm.ok()) {
    fail("allocate", warm.status());
  }
  LoopbackRun run;
  Clock::time_point start_time = Clock::now();
  for (int64_t i = 0; fd >= 0 && i < count; ++i) {
    auto fresh = Tensor::uninitialized(DType::kUInt8, {static_cast<int64_t>(size)});
    if (!fresh.ok()) fail("allocate", fresh.status());
    size_t got = 0;
    while (got < size) {
      ssize_t n = recv(fd, fresh->mutable_data() + got, size - got, 0);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (got < size) break;
    ++run.messages;
  }
  run.seconds = seconds_since(start_time);
  run.bytes = run.messages * static_cast<int64_t>(size);
  sender.join();
  if (fd >= 0) close(fd);
  close(listener);
  return run;
}

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOOPBACK_TCP_H_
