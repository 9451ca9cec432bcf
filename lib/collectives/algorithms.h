// The host collectives, written once against the Transport seam
// (transport.h): whatever moves the bytes (TCP, shared memory, a test's
// in-memory fake), the same exchanges run in the same order.
//
//   direct all-reduce   every rank sends its tensor to every other (one
//                       round trip: lowest latency); up to
//                       CollectiveOptions::direct_max_bytes.
//   ring all-reduce     reduce-scatter then all-gather around the ring
//                       (rank r sends to r+1, receives from r-1), pipelined
//                       (one message each way, steps overlapping) or phased
//                       (one exchange per step).
//   fused all-reduce    tensors packed into buckets, each all-reduced.
//   broadcast, all_gather, reduce_scatter, barrier: direct.
//
// Every rank gets bit-identical results: each part of a result is reduced
// once, by one rank, in a fixed order. Each operation takes the next
// sequence number (in its headers), so ranks calling different operations
// fail with InvalidArgument naming both.
//
// Thread-compatible: one operation at a time (the communicator's thread).
#ifndef CAPSTAN_LIB_COLLECTIVES_ALGORITHMS_H_
#define CAPSTAN_LIB_COLLECTIVES_ALGORITHMS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "capstan/collectives.h"
#include "capstan/status.h"
#include "capstan/tensor.h"
#include "collectives/reduce.h"
#include "collectives/transport.h"

namespace capstan::collectives {

class Algorithms {
 public:
  // `transport` must outlive this; every rank passes the same options.
  Algorithms(Transport& transport, const CollectiveOptions& options);

  // Which ring all-reduce runs: the pipelined one for payloads of at least
  // `min_bytes`, the phased one below (0: always pipelined; kNever: always
  // phased, the default). The same on every rank (the communicator agrees
  // on it when the group forms), so every rank picks the same ring.
  static constexpr int64_t kNever = INT64_MAX;
  void set_pipelined_ring_from(int64_t min_bytes) { pipelined_min_bytes_ = min_bytes; }
  // From which payload (bytes) the rings write their reductions (and the
  // pipelined ring its gathered chunks) with non-temporal stores
  // (collectives/reduce.h, Stores): where the operation's own traffic
  // (every rank's input and output: 32 MiB for two ranks at 8 MiB) evicts
  // the results from a cache of tens of MiB anyway, skipping the read of
  // each line before it is written pays. Results are the same either way,
  // so ranks need not agree.
  static constexpr int64_t kStreamingStoresFrom = int64_t{8} << 20;
  void set_streaming_stores_from(int64_t min_bytes) { streaming_min_bytes_ = min_bytes; }
  // The sequence number of the last operation begun (0: none yet).
  int64_t sequence() const { return sequence_; }

  Result<Tensor> all_reduce(const Tensor& tensor, ReduceOp op);
  Result<std::vector<Tensor>> all_reduce_fused(const std::vector<Tensor>& tensors, ReduceOp op);
  Result<Tensor> broadcast(const Tensor& tensor, int root);
  Result<Tensor> all_gather(const Tensor& tensor);
  Result<Tensor> reduce_scatter(const Tensor& tensor, ReduceOp op);
  Status barrier();

 private:
  // Reduces `input` (count elements) into `output` (the same size; may be
  // the same buffer).
  Status all_reduce_buffers(const std::byte* input, std::byte* output, DType dtype, ReduceOp op, int64_t count);
  Status direct_all_reduce(std::byte* buffer, DType dtype, ReduceOp op, int64_t count);
  Status ring_all_reduce(const std::byte* input, std::byte* buffer, DType dtype, ReduceOp op, int64_t count);
  Status phased_ring_all_reduce(const std::byte* input, std::byte* buffer, DType dtype, ReduceOp op, int64_t count);

  Header header(Kind kind, DType dtype, ReduceOp op, int64_t elements, int64_t aux, size_t bytes) const;
  Clock::time_point op_deadline() const { return Clock::now() + options_.timeout; }
  // A receive buffer for `peer`'s data, kept across operations (fresh pages
  // cost more than the copy into them: page faults dominate otherwise).
  std::byte* scratch_for(int peer, size_t bytes);
  // How an all-reduce of `bytes` writes its results (streaming_min_bytes_).
  Stores stores_for(int64_t bytes) const;

  Transport& transport_;
  const CollectiveOptions options_;
  const int rank_;
  const int size_;
  int64_t pipelined_min_bytes_ = kNever;
  int64_t streaming_min_bytes_ = kStreamingStoresFrom;
  int64_t sequence_ = 0;
  std::vector<std::vector<std::byte>> scratch_;  // by peer
};

}  // namespace capstan::collectives

#endif  // CAPSTAN_LIB_COLLECTIVES_ALGORITHMS_H_
