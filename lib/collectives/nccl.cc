#include "collectives/nccl.h"

#ifdef CAPSTAN_WITH_CUDA

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "sync/mutex.h"

namespace capstan::collectives {
namespace {

using Clock = std::chrono::steady_clock;

// The NCCL entry points Capstan uses, resolved from libnccl.so.2.
struct Nccl {
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&::ncclCommGetAsyncError) get_async_error = nullptr;
  decltype(&::ncclCommAbort) abort = nullptr;
  decltype(&::ncclCommDestroy) destroy = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&::ncclGetVersion) get_version = nullptr;
  Status loaded;
};

const Nccl& nccl() {
  static Nccl* api = []() {
    auto* n = new Nccl();
    void* library = nullptr;
    for (const char* name : {"libnccl.so.2", "libnccl.so"}) {
      library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (library != nullptr) break;
    }
    if (library == nullptr) {
      n->loaded = Status::FailedPrecondition(
          std::string("NCCL is not installed here (dlopen libnccl.so.2: ") + dlerror() +
          "); install it (Debian: libnccl2) or add its directory to LD_LIBRARY_PATH");
      return n;
    }
    bool all = true;
    auto resolve = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(library, symbol));
      if (fn == nullptr) all = false;
    };
    resolve(n->get_unique_id, "ncclGetUniqueId");
    resolve(n->init_rank_config, "ncclCommInitRankConfig");
    resolve(n->get_async_error, "ncclCommGetAsyncError");
    resolve(n->abort, "ncclCommAbort");
    resolve(n->destroy, "ncclCommDestroy");
    resolve(n->error_string, "ncclGetErrorString");
    resolve(n->all_reduce, "ncclAllReduce");
    resolve(n->broadcast, "ncclBroadcast");
    resolve(n->all_gather, "ncclAllGather");
    resolve(n->reduce_scatter, "ncclReduceScatter");
    resolve(n->get_version, "ncclGetVersion");
    if (!all) {
      n->loaded = Status::FailedPrecondition("libnccl.so.2 lacks entry points Capstan needs (NCCL 2.14 or newer)");
    }
    return n;
  }();
  return *api;
}

// NCCL's type of each dtype nccl_takes().
Result<ncclDataType_t> nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    default:
      return Status::InvalidArgument("device collectives take float32, float64, int32, int64, float16 or bfloat16, "
                                     "not " + std::string(dtype_name(dtype)));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMean: return ncclAvg;
  }
  return ncclSum;
}

}  // namespace

Status device_collectives_status() {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky error of a machine without a driver
    return Status::FailedPrecondition(std::string("no CUDA device here (") +
                                      (error != cudaSuccess ? cudaGetErrorString(error) : "0 devices") +
                                      "): device collectives need a GPU and its driver");
  }
  return nccl().loaded;
}

struct NcclBackend::Impl {
  int device = 0;
  std::chrono::milliseconds timeout{60000};
  int rank = 0;
  int size = 1;
  Mutex mutex;
  ncclComm_t comm GUARDED_BY(mutex) = nullptr;
  Status aborted GUARDED_BY(mutex);
  // interrupt(): the operation waiting now gives up (from any thread).
  std::atomic<bool> interrupted{false};
  Mutex interrupt_mutex;
  Status interrupt_reason GUARDED_BY(interrupt_mutex);

  ~Impl() {
    MutexLock lock(mutex);
    if (comm != nullptr) {
      if (aborted.ok()) {
        nccl().destroy(comm);
      }
    }
  }

  std::string nccl_error(ncclResult_t result) const { return nccl().error_string(result); }

  // Waits for the communicator's pending work (init, or an operation on
  // `stream`) without ever waiting past the deadline.
  Status wait(ncclComm_t c, cudaStream_t stream, bool stream_work, const char* what, Clock::time_point deadline)
      REQUIRES(mutex) {
    const Clock::time_point started = Clock::now();
    while (true) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t got = nccl().get_async_error(c, &state);
      if (got != ncclSuccess) state = got;
      if (state != ncclSuccess && state != ncclInProgress) return give_up(failure(what, state));
      bool finished = state == ncclSuccess;
      if (finished && stream_work) {
        cudaError_t q = cudaStreamQuery(stream);
        if (q == cudaErrorNotReady) {
          finished = false;
        } else if (q != cudaSuccess) {
          return give_up(Status::Internal(std::string("CUDA stream of NCCL ") + what + ": " + cudaGetErrorString(q)));
        }
      }
      if (finished) return Status::Ok();
      if (interrupted.load(std::memory_order_acquire)) {
        MutexLock lock(interrupt_mutex);
        return give_up(interrupt_reason);
      }
      if (Clock::now() >= deadline) {
        return give_up(Status::Unavailable(std::string("NCCL ") + what + " did not finish within " +
                                           std::to_string(timeout.count()) +
                                           " ms (a peer is dead or stuck); the NCCL communicator was aborted"));
      }
      // Spin first, as cudaStreamSynchronize does by default: most
      // operations end within microseconds, and a sleep costs ~100 µs of
      // wake-up. Past the first millisecond, poll every 50 µs.
      if (Clock::now() - started < std::chrono::milliseconds(1)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  // An asynchronous NCCL error as a Status of the kind the caller can act on.
  Status failure(const char* what, ncclResult_t state) const {
    std::string text = std::string("NCCL ") + what + " failed: " + nccl_error(state);
    switch (state) {
      case ncclInvalidUsage:
      case ncclInvalidArgument:
        return Status::InvalidArgument(
            text + " (the group's ranks use NCCL wrongly, two ranks on one GPU for instance); the NCCL "
                   "communicator was aborted");
      case ncclRemoteError:
        return Status::Unavailable(text + " (a peer died, or its link broke)");
      case ncclSystemError:
        return Status::Unavailable(text + " (a peer died or its link broke, or a system call failed here: "
                                          "NCCL_DEBUG=WARN says which)");
      default:
        return Status::Internal(text + "; the NCCL communicator was aborted");
    }
  }

  Status give_up(const Status& why) REQUIRES(mutex) {
    if (comm != nullptr) nccl().abort(comm);
    aborted = why;
    return why;
  }

  Status usable() REQUIRES(mutex) {
    if (aborted.ok() && interrupted.load(std::memory_order_acquire)) {
      MutexLock lock(interrupt_mutex);
      (void)give_up(interrupt_reason);
    }
    if (!aborted.ok()) {
      return Status::Aborted("the NCCL communicator was aborted after: " + aborted.to_string() +
                                        "; form a new group (the next generation)");
    }
    cudaError_t error = cudaSetDevice(device);
    return error == cudaSuccess ? Status::Ok()
                                : Status::InvalidArgument("cannot use CUDA device " + std::to_string(device) + ": " +
                                                          cudaGetErrorString(error));
  }

  template <typename Issue>
  Status run(const char* what, void* stream, Issue issue) {
    MutexLock lock(mutex);
    CAPSTAN_RETURN_IF_ERROR(usable());
    auto s = static_cast<cudaStream_t>(stream);
    ncclResult_t issued = issue(comm, s);
    if (issued == ncclInvalidArgument || issued == ncclInvalidUsage) {
      // This call was wrong; the communicator is fine.
      return Status::InvalidArgument(std::string("NCCL ") + what + ": " + nccl_error(issued));
    }
    // Else the communicator's own error (a non-blocking one reports it here).
    if (issued != ncclSuccess && issued != ncclInProgress) return give_up(failure(what, issued));
    return wait(comm, s, true, what, Clock::now() + timeout);
  }
};

NcclBackend::NcclBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclBackend::~NcclBackend() = default;
int NcclBackend::device() const { return impl_->device; }
                        
                        void NcclBackend::interrupt(const Status& reason) {
  {
    MutexLock lock(impl_->interrupt_mutex);
    if (impl_->interrupt_reason.ok()) impl_->interrupt_reason = reason;
  }
  impl_->interrupted.store(true, std::memory_order_release);
}

Result<std::unique_ptr<DeviceBackend>> NcclBackend::create(HostGroup& host, int device,
                                                           std::chrono::milliseconds timeout) {
  // Every rank learns first whether all of them can: one that cannot must
  // not leave the others waiting for an id that never comes.
  Status here = device_collectives_status();
  if (cudaError_t error = here.ok() ? cudaSetDevice(device) : cudaSuccess; error != cudaSuccess) {
    here = Status::InvalidArgument(
        "cannot use CUDA device " + std::to_string(device) + " here (" + cudaGetErrorString(error) +
        (error == cudaErrorInitializationError ? "; was this process forked after its parent used CUDA?" : "") + ")");
  }
  CAPSTAN_ASSIGN_OR_RETURN(Tensor all, host.all_reduce(Tensor::scalar<int32_t>(here.ok() ? 1 : 0), ReduceOp::kMin));
  if (!here.ok()) return here;
  if (all.flat<int32_t>()[0] != 1) {
    return Status::FailedPrecondition("another rank of the group cannot use the device collectives (its error says why)");
  }
  const Nccl& api = nccl();
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  impl->timeout = timeout;
  impl->rank = host.rank();
  impl->size = host.size();
  // Rank 0's unique id, to every rank over the host group.
  ncclUniqueId id{};
  static_assert(sizeof(ncclUniqueId) % sizeof(int64_t) == 0);
  Status made;
  if (host.rank() == 0) {
    ncclResult_t r = api.get_unique_id(&id);
    if (r != ncclSuccess) made = Status::Internal(std::string("ncclGetUniqueId: ") + api.error_string(r));
  }
  // Rank 0's success first, so that nobody waits for an id that never comes.
  CAPSTAN_ASSIGN_OR_RETURN(Tensor ok, host.broadcast(Tensor::scalar<int32_t>(made.ok() ? 1 : 0), 0));
  if (ok.flat<int32_t>()[0] != 1) {
    return host.rank() == 0 ? made : Status::Internal("rank 0 could not make an NCCL unique id");
  }
  CAPSTAN_ASSIGN_OR_RETURN(Tensor bytes, Tensor::uninitialized(DType::kInt64, {sizeof(ncclUniqueId) / sizeof(int64_t)}));
  std::memcpy(bytes.mutable_data(), &id, sizeof(id));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor shared, host.broadcast(bytes, 0));
  std::memcpy(&id, shared.data(), sizeof(id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init and operations return at once; we poll, with a deadline
  MutexLock lock(impl->mutex);
  ncclResult_t started = api.init_rank_config(&impl->comm, host.size(), id, host.rank(), &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    return Status::Unavailable(std::string("ncclCommInitRankConfig: ") + api.error_string(started));
  }
  CAPSTAN_RETURN_IF_ERROR(impl->wait(impl->comm, nullptr, false, "communicator init", Clock::now() + timeout));
  return std::unique_ptr<DeviceBackend>(new NcclBackend(std::move(impl)));
}

Status NcclBackend::all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, void* stream) {
  CAPSTAN_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_dtype(dtype));
  return impl_->run("all_reduce", stream, [&](ncclComm_t c, cudaStream_t s) {
    return nccl().all_reduce(send, recv, static_cast<size_t>(count), t, nccl_op(op), c, s);
  });
}

Status NcclBackend::broadcast(void* buffer, int64_t count, DType dtype, int root, void* stream) {
  CAPSTAN_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_dtype(dtype));
  if (root < 0 || root >= impl_->size) {
    return Status::InvalidArgument("broadcast: root " + std::to_string(root) + " is not a rank of this group of " +
                                   std::to_string(impl_->size));
  }
  return impl_->run("broadcast", stream, [&](ncclComm_t c, cudaStream_t s) {
    return nccl().broadcast(buffer, buffer, static_cast<size_t>(count), t, root, c, s);
  });
}

Status NcclBackend::all_gather(const void* send, void* recv, int64_t count_per_rank, DType dtype, void* stream) {
  CAPSTAN_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_dtype(dtype));
  return impl_->run("all_gather", stream, [&](ncclComm_t c, cudaStream_t s) {
    return nccl().all_gather(send, recv, static_cast<size_t>(count_per_rank), t, c, s);
  });
}

Status NcclBackend::reduce_scatter(const void* send, void* recv, int64_t count_per_rank, DType dtype, ReduceOp op,
                                   void* stream) {
  CAPSTAN_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_dtype(dtype));
  return impl_->run("reduce_scatter", stream, [&](ncclComm_t c, cudaStream_t s) {
    return nccl().reduce_scatter(send, recv, static_cast<size_t>(count_per_rank), t, nccl_op(op), c, s);
  });
}

}  // namespace capstan::collectives

#else  // !CAPSTAN_WITH_CUDA

namespace capstan::collectives {

Status device_collectives_status() {
  return Status::Unimplemented(
      "this Capstan was built without CUDA: device collectives need a build where the CUDA toolkit was found "
      "(CAPSTAN_CUDA=ON)");
}

struct NcclBackend::Impl {};
NcclBackend::NcclBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclBackend::~NcclBackend() = default;
int NcclBackend::device() const { return -1; }
                        void NcclBackend::interrupt(const Status&) {}
                        Result<std::unique_ptr<DeviceBackend>> NcclBackend::create(HostGroup&, int, std::chrono::milliseconds) {
  return device_collectives_status();
}
Status NcclBackend::all_reduce(const void*, void*, int64_t, DType, ReduceOp, void*) { return device_collectives_status(); }
                               Status NcclBackend::broadcast(void*, int64_t, DType, int, void*) { return device_collectives_status(); }
                               Status NcclBackend::all_gather(const void*, void*, int64_t, DType, void*) { return device_collectives_status(); }
                               Status NcclBackend::reduce_scatter(const void*, void*, int64_t, DType, ReduceOp, void*) {
  return device_collectives_status();
}

}  // namespace capstan::collectives

#endif  // CAPSTAN_WITH_CUDA

namespace capstan::collectives {

bool nccl_takes(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kFloat16:
    case DType::kBFloat16: return true;
    default: return false;
  }
}

}  // namespace capstan::collectives
