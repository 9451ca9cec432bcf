// The collectives on device buffers (CUDA), behind one interface (c10d's
// Backend): the communicator's *_device calls go to the DeviceBackend its
// DeviceCollectives made, never to NCCL itself. The NCCL backend (nccl.h)
// is the one Capstan ships; a build without CUDA makes none (Unimplemented).
//
// Unlike the host collectives (algorithms.h over transport.h), a device
// backend runs whole collectives: NCCL schedules its own rings on the GPU.
// What the two share is the group: the backend is made over the host group
// (HostGroup below: its rank, size, and the exchange of NCCL's unique id),
// and Communicator::abort interrupts both.
#ifndef CAPSTAN_LIB_COLLECTIVES_DEVICE_BACKEND_H_
#define CAPSTAN_LIB_COLLECTIVES_DEVICE_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "capstan/collectives.h"
#include "capstan/status.h"
#include "capstan/tensor.h"
#include "sync/mutex.h"

namespace capstan::collectives {

// What a device backend needs of the host group it is made over: the
// ranks, and host collectives that run in order with the group's other
// operations (the public Communicator's, in sdk/src/collectives). Each call
// is collective: every rank makes it.
class HostGroup {
 public:
  virtual ~HostGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  [[nodiscard]] virtual Result<Tensor> all_reduce(const Tensor& tensor, ReduceOp op) = 0;
  [[nodiscard]] virtual Result<Tensor> broadcast(const Tensor& tensor, int root) = 0;
};

// Thread-safe: operations are issued one at a time in the order callers
// reach them; interrupt() from any thread.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // The CUDA ordinal this rank's backend uses.
  virtual int device() const = 0;
  // The operation waiting now (and every later one) fails with `reason`.
  virtual void interrupt(const Status& reason) = 0;

  // `stream` is a cudaStream_t (nullptr: the legacy default stream). Each
  // returns once the operation finished on the stream. Counts are
  // elements; all_gather and reduce_scatter take the count per rank.
  [[nodiscard]] virtual Status all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                                          void* stream) = 0;
  [[nodiscard]] virtual Status broadcast(void* buffer, int64_t count, DType dtype, int root, void* stream) = 0;
  [[nodiscard]] virtual Status all_gather(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                                          void* stream) = 0;
  [[nodiscard]] virtual Status reduce_scatter(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                                              ReduceOp op, void* stream) = 0;
};

// A communicator's device backend, made on first use for one device.
// Thread-safe.
class DeviceCollectives {
 public:
  // Makes the backend for a device (collective: every rank's first device
  // call makes one).
  using Factory = std::function<Result<std::unique_ptr<DeviceBackend>>(int device)>;
  explicit DeviceCollectives(Factory make) : make_(std::move(make)) {}

  // The backend, made now if this is the first call. InvalidArgument, naming
  // both, when an earlier call made it for another device; the factory's
  // error (and another try next call) when it could not be made.
  Result<DeviceBackend*> backend(int device) LOCKS_EXCLUDED(mutex_);
  // Interrupts the backend, if one was made.
  void interrupt(const Status& why) LOCKS_EXCLUDED(mutex_);

 private:
  const Factory make_;
  Mutex mutex_;
  // Set once; never replaced, so a pointer handed out stays valid.
  std::unique_ptr<DeviceBackend> backend_ GUARDED_BY(mutex_);
};

}  // namespace capstan::collectives

#endif  // CAPSTAN_LIB_COLLECTIVES_DEVICE_BACKEND_H_
