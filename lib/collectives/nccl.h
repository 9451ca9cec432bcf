// The collectives on CUDA device buffers, through NCCL: the DeviceBackend
// of a Communicator (rank for rank), made on its first device call; the
// unique id goes from rank 0 to the others over the group's own (host)
// broadcast (HostGroup, device_backend.h), and the group was formed through
// the coordinator's rendezvous, so the coordinator is where the ranks met.
//
// libnccl.so.2 is loaded with dlopen() on first use, not linked: a CPU-only
// deployment runs the same binaries, and a process that never touches a GPU
// never loads the 200 MB library. The CUDA runtime is linked statically
// (cudart_static) when Capstan is built with CUDA.
//
// Never hangs on a dead peer: the communicator runs in NCCL's non-blocking
// mode; each operation is issued, then its stream is polled until it
// finishes, NCCL reports an error (ncclCommGetAsyncError), or the deadline
// passes, and then the communicator is aborted (ncclCommAbort) and the call
// fails with Unavailable. An aborted NCCL communicator is not made again for
// the same group: form the next generation, as on the host.
//
// Thread-safety: thread-safe; operations are issued one at a time in the
// order callers reach the mutex.
#ifndef CAPSTAN_LIB_COLLECTIVES_NCCL_H_
#define CAPSTAN_LIB_COLLECTIVES_NCCL_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "capstan/collectives.h"
#include "capstan/status.h"
#include "collectives/device_backend.h"

namespace capstan::collectives {

// Why the device collectives cannot run in this process, or OK: built
// without CUDA (Unimplemented), no GPU or no driver, or libnccl.so.2 not
// found (FailedPrecondition naming the fix).
Status device_collectives_status();

// Whether NCCL carries `dtype`: float16, bfloat16, float32, float64, int32,
// int64 (whatever the build; the others are copied through the host by
// callers that take them).
bool nccl_takes(DType dtype);

// The NCCL DeviceBackend (device_backend.h).
class NcclBackend : public DeviceBackend {
 public:
  // `host` carries the unique id (its rank and size are NCCL's); `device`
  // is the CUDA ordinal this rank uses. Collective: every rank of `host`
  // calls it.
  static Result<std::unique_ptr<DeviceBackend>> create(HostGroup& host, int device,
                                                       std::chrono::milliseconds timeout);
  ~NcclBackend() override;

  int device() const override;
  // The NCCL communicator is aborted too.
  void interrupt(const Status& reason) override;

  [[nodiscard]] Status all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                                  void* stream) override;
  [[nodiscard]] Status broadcast(void* buffer, int64_t count, DType dtype, int root, void* stream) override;
  [[nodiscard]] Status all_gather(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                                  void* stream) override;
  [[nodiscard]] Status reduce_scatter(const void* send, void* recv, int64_t count_per_rank, DType dtype, ReduceOp op,
                                      void* stream) override;

  struct Impl;

 private:
  explicit NcclBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace capstan::collectives

#endif  // CAPSTAN_LIB_COLLECTIVES_NCCL_H_
