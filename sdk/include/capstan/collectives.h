// Collective operations among the ranks of a group (TF's CollectiveOps,
// NCCL's and Gloo's communicators): all-reduce, broadcast, all-gather,
// reduce-scatter and barrier over tensors, between processes on one host or
// many.
//
//   auto endpoint = capstan::CollectiveEndpoint::listen("10.0.0.5").value();
//   ... share endpoint->address() with the other ranks (rendezvous) ...
//   auto group = capstan::Communicator::create(std::move(endpoint), addresses, rank).value();
//   capstan::Tensor sum = group->all_reduce(gradient, capstan::ReduceOp::kSum).value();
//
// Every rank must call the same operations, in the same order, with
// matching dtypes and shapes. What does not match fails with
// InvalidArgument naming both sides, on every rank that sees it. Every
// operation has a deadline (CollectiveOptions::timeout): when a peer dies,
// closes its connection or stops sending (alive but stuck), the operation
// fails with Unavailable naming the rank(s) it was waiting for, instead of
// hanging. Any failure aborts the group: later calls fail with
// Aborted, and the survivors form a new group (a new
// Communicator, with the next generation number).
//
// Algorithms (chosen by size; see docs/design.md for the crossover measured):
// tensors up to CollectiveOptions::direct_max_bytes go straight from every
// rank to every other (one round trip: lowest latency); larger all-reduces
// use a ring (reduce-scatter then all-gather, 2(n-1)/n of the data through
// each link, reduction overlapped with the transfer segment by segment).
// Every rank gets bit-identical results: each part of the result is reduced
// once, by one rank, in a fixed order.
//
// Dtypes: float32, float64, int32, int64, and float16/bfloat16 (reduced in
// float32, rounded back once). Thread-safety: a Communicator may be called
// from any thread; operations run one at a time, in the order they were
// called, on the communicator's own thread (the *_async forms return at
// once).
#ifndef CAPSTAN_COLLECTIVES_H_
#define CAPSTAN_COLLECTIVES_H_

#include "capstan/export.h"

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"

namespace capstan CAPSTAN_API {

enum class ReduceOp { kSum, kMean, kMin, kMax, kProd };

struct CollectiveOptions {
  // Each operation, and forming the group, fails with Unavailable after this.
  std::chrono::milliseconds timeout{60000};
  // Tensors up to this many bytes go directly from every rank to every
  // other; larger all-reduces take the ring.
  int64_t direct_max_bytes = 128 << 10;
  // The ring moves and reduces its chunks in segments of this many bytes
  // (over TCP; shared memory moves 256 KiB pieces).
  int64_t segment_bytes = 256 << 10;
  // The fused all-reduce packs tensors into buckets of at most this many
  // bytes (Horovod's tensor fusion), the first at most first_bucket_bytes
  // (PyTorch DDP's), so that the first exchange starts early.
  int64_t fusion_bucket_bytes = 25 << 20;
  int64_t first_bucket_bytes = 1 << 20;

  // How data moves between two ranks. kAuto: through shared memory when
  // both can map the same segment (one host, one /dev/shm; checked when the
  // group forms), TCP otherwise. kTcp: TCP only. kSharedMemory: shared memory
  // only; forming the group fails with Unavailable naming the ranks that
  // cannot share memory. Every rank must pass the same transport.
  enum class Transport { kAuto, kTcp, kSharedMemory };
  Transport transport = Transport::kAuto;
  // TCP data connections per pair of ranks: a payload is striped over them
  // segment by segment (segment k on stream k % tcp_streams). More streams
  // keep more bytes in flight in the kernel: on loopback here 4 streams of
  // 256 KiB segments move a 16 MiB all-reduce ~1.35x as fast as one
  // (docs/design.md); a NIC with a per-flow limit gains more.
  int tcp_streams = 4;
  // Shared memory per direction of each pair of ranks on one host.
  int64_t shm_buffer_bytes = 4 << 20;
  // The ring all-reduce: kPipelined sends each piece on as soon as it
  // arrived (steps and phases overlap); kPhased runs one step after the
  // other. kAuto: pipelined where the ring's links are shared memory; over
  // TCP pipelined for all-reduces of 64 MiB and more, phased below (the
  // sizes where each measured faster; docs/design.md). Every rank must pass
  // the same.
  enum class Ring { kAuto, kPipelined, kPhased };
  Ring ring = Ring::kAuto;
};

// "auto", "tcp", "shm" (configuration files use these names).
std::string_view collective_transport_name(CollectiveOptions::Transport transport);
Result<CollectiveOptions::Transport> collective_transport_from_name(std::string_view name);

// Where this rank listens for its peers. Its address (host:port) is what the
// rendezvous hands to the other ranks. `host` is the interface used for data:
// name the one the other hosts reach (a wrong interface is a classic trap).
class CollectiveEndpoint {
 public:
  // Port 0 picks a free port.
  static Result<std::unique_ptr<CollectiveEndpoint>> listen(const std::string& host = "127.0.0.1", int port = 0);
  ~CollectiveEndpoint();
  const std::string& address() const;

  struct CAPSTAN_HIDDEN Impl;
  explicit CollectiveEndpoint(std::unique_ptr<Impl> impl);
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

class Communicator {
 public:
  // Forms the group of addresses.size() ranks: rank `rank` is this process,
  // listening on `endpoint` (whose address is addresses[rank]); connects to
  // every other rank. All ranks must pass the same addresses and
  // generation. Unavailable, naming the missing ranks, when the group is not
  // complete within options.timeout.
  static Result<std::unique_ptr<Communicator>> create(std::unique_ptr<CollectiveEndpoint> endpoint,
                                                      std::vector<std::string> addresses, int rank,
                                                      int64_t generation = 1, CollectiveOptions options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  int64_t generation() const;
  // Every rank's data address (host:port), by rank: what to log to check
  // that the ranks reach each other on the intended interface.
  const std::vector<std::string>& addresses() const;
  // How this rank reaches each rank, by rank: "self", "shm" or "tcp".
  const std::vector<std::string>& transports() const;
  // "rank 1 of 2 (generation 3): 0 10.0.0.5:41000 shm, 1 10.0.0.5:41002 self",
  // for logs: the addresses and transports the group really uses.
  std::string describe() const;
  // True once an operation failed: the group is unusable.
  bool aborted() const;
  // Gives up on the group from any thread, e.g. when this rank's step
  // failed before it reached its collectives, or a supervisor learned that
  // a member died: this rank's running operation (if any) fails at once, the
  // other ranks' current or next operation fails with Unavailable carrying
  // `reason` (instead of waiting for the deadline), and the group is
  // aborted. Returns at once (the communicator's thread tells the peers);
  // operations called after it fail with FailedPrecondition.
  void abort(const Status& reason);

  // Every rank's tensor (same dtype and shape) reduced element-wise; every
  // rank gets the result.
  Result<Tensor> all_reduce(const Tensor& tensor, ReduceOp op);
  // Many tensors reduced in few exchanges (buckets; see CollectiveOptions).
  Result<std::vector<Tensor>> all_reduce(const std::vector<Tensor>& tensors, ReduceOp op);
  // `root`'s tensor on every rank; the others pass a tensor of the same
  // dtype and shape (its values are ignored).
  Result<Tensor> broadcast(const Tensor& tensor, int root);
  // The ranks' tensors concatenated along dimension 0, in rank order; their
  // first dimensions may differ, the others must match. Scalars count as one
  // row.
  Result<Tensor> all_gather(const Tensor& tensor);
  // all_reduce, then rank r keeps rows [r*d/n...] of dimension 0 (the first
  // d % n ranks one row more).
  Result<Tensor> reduce_scatter(const Tensor& tensor, ReduceOp op);
  // Returns once every rank has called it.
  Status barrier();

  // The same, returning at once; the future is ready when the operation is.
  // Operations still run in call order.
  std::future<Result<Tensor>> all_reduce_async(Tensor tensor, ReduceOp op);
  std::future<Result<std::vector<Tensor>>> all_reduce_async(std::vector<Tensor> tensors, ReduceOp op);

  // ---- CUDA device buffers (NCCL) ----
  // The same collectives on device memory, where Capstan was built with
  // CUDA and NCCL can be loaded (device_collectives() says): `device` is
  // this rank's CUDA ordinal, `stream` a cudaStream_t (nullptr: the default
  // stream); each call returns once the operation finished on the stream.
  // The NCCL communicator is made on the first device call (collective:
  // every rank makes one); its unique id goes from rank 0 over this group,
  // which the coordinator's rendezvous formed. Deadline:
  // CollectiveOptions::timeout; a dead or stuck peer aborts the NCCL
  // communicator and the call fails with Unavailable, never a hang (NCCL's
  // invalid usage, two ranks on one GPU say, is InvalidArgument; its other
  // errors Internal; after an abort, calls are Aborted: form the
  // next generation).
  // Unimplemented in a build without CUDA; FailedPrecondition without a GPU
  // or libnccl.so.2. Counts are elements; all_gather and reduce_scatter
  // take the count per rank (recv holds size() times it for all_gather).
  Status all_reduce_device(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int device,
                           void* stream = nullptr);
  Status broadcast_device(void* buffer, int64_t count, DType dtype, int root, int device, void* stream = nullptr);
  Status all_gather_device(const void* send, void* recv, int64_t count_per_rank, DType dtype, int device,
                           void* stream = nullptr);
  Status reduce_scatter_device(const void* send, void* recv, int64_t count_per_rank, DType dtype, ReduceOp op,
                               int device, void* stream = nullptr);
  // OK when the device collectives can run in this process; else why not.
  static Status device_collectives();
  // Whether the device collectives take `dtype` (NCCL's: float16, bfloat16,
  // float32, float64, int32, int64); a caller holding another copies it
  // through the host collectives.
  static bool device_takes(DType dtype);

  struct CAPSTAN_HIDDEN Impl;

 private:
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace capstan

#endif  // CAPSTAN_COLLECTIVES_H_
