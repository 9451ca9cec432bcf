// The public Communicator and CollectiveEndpoint (capstan/collectives.h),
// wired from lib/collectives' pieces. The group's connections are a Mesh
// (mesh.h), formed once; its failures go through GroupFailure (failure.h);
// bytes move through a MeshTransport (mesh_transport.h: TCP and shared
// memory behind the Transport seam, transport.h); the host collectives are
// Algorithms (algorithms.h) over that seam; device buffers go to a
// DeviceBackend (device_backend.h: NCCL), made on first use over the
// communicator itself (HostGroup). Operations run one at a time, in call
// order, on the communicator's own thread, which also drives the mesh's
// io_context.
#include <deque>
#include <functional>
#include <future>
#include <thread>

#include "capstan/collectives.h"
#include "capstan/phases.h"
#include "capstan/trace.h"
#include "collectives/algorithms.h"
#include "collectives/device_backend.h"
#include "collectives/failure.h"
#include "collectives/mesh.h"
#include "collectives/mesh_transport.h"
#include "collectives/nccl.h"
#include "sync/mutex.h"

namespace capstan {
namespace {

// Ring::kAuto over TCP: the smallest all-reduce (bytes) that runs the
// pipelined ring. 2 ranks on loopback, medians of 5 alternating runs
// (docs/design.md): from 64 MiB it was 1.19x the phased ring on an idle
// machine and 1.25x with one core busy, 0.93x with every core busy; at
// 32 MiB 1.09x, 1.12x and 0.82x.
constexpr int64_t kPipelinedOverTcpFrom = int64_t{64} << 20;

// The host group a device backend is made over: the communicator's own
// operations, in order with the others.
class CommunicatorHostGroup final : public collectives::HostGroup {
 public:
  explicit CommunicatorHostGroup(Communicator& group) : group_(group) {}

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  Result<Tensor> all_reduce(const Tensor& tensor, ReduceOp op) override { return group_.all_reduce(tensor, op); }
  Result<Tensor> broadcast(const Tensor& tensor, int root) override { return group_.broadcast(tensor, root); }

 private:
  Communicator& group_;
};

}  // namespace

// ---- Endpoint ----------------------------------------------------------------------

CollectiveEndpoint::CollectiveEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CollectiveEndpoint::~CollectiveEndpoint() = default;
const std::string& CollectiveEndpoint::address() const { return impl_->address; }

Result<std::unique_ptr<CollectiveEndpoint>> CollectiveEndpoint::listen(const std::string& host, int port) {
  namespace asio = boost::asio;
  using tcp = asio::ip::tcp;
  if (port < 0 || port > 65535) return Status::InvalidArgument("port " + std::to_string(port) + " is not in [0, 65535]");
  boost::system::error_code ec;
  auto ip = asio::ip::make_address(host, ec);
  if (ec) {
    return Status::InvalidArgument("collective host '" + host + "' is not an IP address of this machine's interfaces");
  }
  auto impl = std::make_unique<Impl>();
  tcp::endpoint at(ip, static_cast<uint16_t>(port));
  impl->acceptor.open(at.protocol(), ec);
  if (!ec) impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(at, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status::Unavailable("listening for collective peers on " + host + ":" + std::to_string(port) + ": " +
                               ec.message());
  }
  auto bound = impl->acceptor.local_endpoint();
  std::string h = bound.address().to_string();
  if (bound.address().is_v6()) h = "[" + h + "]";
  impl->address = h + ":" + std::to_string(bound.port());
  return std::make_unique<CollectiveEndpoint>(std::move(impl));
}

// ---- Communicator ------------------------------------------------------------------

// Fields constant after construction first; `mesh`, `failure`'s
// operations-thread side, `transport` and `algorithms` belong to `thread`.
struct Communicator::Impl {
  Impl(std::unique_ptr<CollectiveEndpoint> endpoint_in, std::vector<std::string> addresses, int rank,
       int64_t generation_in, CollectiveOptions options_in)
      : endpoint(std::move(endpoint_in)),
        generation(generation_in),
        options(options_in),
        mesh(endpoint->impl().io, std::move(addresses), rank, options.tcp_streams),
        failure(mesh, generation, options.timeout),
        transport(mesh, failure, options),
        algorithms(transport, options),
        // NCCL's unique id goes from rank 0 over the group itself.
        device([this](int ordinal) {
          CommunicatorHostGroup host(*owner);
          return collectives::NcclBackend::create(host, ordinal, options.timeout);
        }) {}

  ~Impl() {
    {
      MutexLock lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    if (thread.joinable()) thread.join();
    mesh.close_all();
  }

  void start() { thread = std::thread([this]() { run(); }); }

  void run() {
    while (true) {
      std::function<void()> task;
      {
        MutexLock lock(mutex);
        while (!stopping && tasks.empty()) wake.wait(mutex);
        if (tasks.empty()) return;
        task = std::move(tasks.front());
        tasks.pop_front();
      }
      task();
    }
  }

  template <typename T>
  std::future<T> submit(std::function<T()> op) LOCKS_EXCLUDED(mutex) {
    auto task = std::make_shared<std::packaged_task<T()>>(std::move(op));
    std::future<T> result = task->get_future();
    {
      MutexLock lock(mutex);
      tasks.push_back([task]() { (*task)(); });
    }
    wake.notify_all();
    return result;
  }

  // Runs `op` (on `thread`) as a collective span naming the group, this
  // rank and the operation's sequence number(s) (the flight recorder, a
  // trace). A failure that names silent ranks (a deadline passed, a rank
  // died) reports the group's last records here.
  template <typename T>
  T traced(const char* name, size_t bytes, const std::function<T()>& op) {
    const int64_t first = algorithms.sequence() + 1;
    trace::Span span(trace::Kind::kCollective, name, describe(first, first, bytes));
    T result = op();
    const int64_t last = algorithms.sequence();
    if (last > first) span.set_detail(describe(first, last, bytes));
    const Status status = status_of(result);
    if (!status.ok()) {
      span.fail(status.to_string());
      span.finish();
      if (status.code() == StatusCode::kUnavailable) report_group(name, first, status);
    }
    return result;
  }

  static Status status_of(const Status& status) { return status; }
  template <typename T>
  static Status status_of(const Result<T>& result) {
    return result.status();
  }

  // "generation 3, rank 0 of 3, seq 41, 4096 bytes": the prefix names the
  // group (report_group finds its records by it).
  std::string group_prefix() const {
    return "generation " + std::to_string(generation) + ", rank " + std::to_string(mesh.rank) + " of " +
           std::to_string(mesh.size) + ", ";
  }
  std::string describe(int64_t first, int64_t last, size_t bytes) const {
    return group_prefix() + "seq " + std::to_string(first) + (last > first ? "-" + std::to_string(last) : "") +
           ", " + std::to_string(bytes) + " bytes";
  }

  void report_group(const char* name, int64_t sequence, const Status& status) const {
    static constexpr size_t kRecords = 16;
    const std::string prefix = group_prefix();
    std::vector<trace::FlightRecord> records;
    for (auto& r : trace::Recorder::get().flight()) {
      if (r.kind == trace::Kind::kCollective && r.detail.compare(0, prefix.size(), prefix) == 0) {
        records.push_back(std::move(r));
      }
    }
    if (records.size() > kRecords) records.erase(records.begin(), records.end() - kRecords);
    trace::report("collective " + std::string(name) + " #" + std::to_string(sequence) + " of the group (" +
                  prefix.substr(0, prefix.size() - 2) + ") failed: " + status.to_string() +
                  "\nthe group's last " + std::to_string(records.size()) + " operation(s) here (flight recorder):\n" +
                  trace::format_records(records, trace::now_ns()));
  }

  // The endpoint owns the io_context the mesh runs on.
  std::unique_ptr<CollectiveEndpoint> endpoint;
  const int64_t generation;
  const CollectiveOptions options;
  collectives::Mesh mesh;
  collectives::GroupFailure failure;
  collectives::MeshTransport transport;
  collectives::Algorithms algorithms;
  collectives::DeviceCollectives device;

  Mutex mutex;
  CondVar wake;
  bool stopping GUARDED_BY(mutex) = false;
  std::deque<std::function<void()>> tasks GUARDED_BY(mutex);
  std::thread thread;
  Communicator* owner = nullptr;  // set by the Communicator that owns this
};

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) { impl_->owner = this; }
Communicator::~Communicator() = default;

Result<std::unique_ptr<Communicator>> Communicator::create(std::unique_ptr<CollectiveEndpoint> endpoint,
                                                           std::vector<std::string> addresses, int rank,
                                                           int64_t generation, CollectiveOptions options) {
  if (endpoint == nullptr) return Status::InvalidArgument("Communicator::create: no endpoint");
  const int size = static_cast<int>(addresses.size());
  if (size < 1) return Status::InvalidArgument("Communicator::create: a group needs at least one address");
  if (rank < 0 || rank >= size) {
    return Status::InvalidArgument("Communicator::create: rank " + std::to_string(rank) + " is not in [0, " +
                                   std::to_string(size) + ")");
  }
  if (options.timeout.count() <= 0) {
    return Status::InvalidArgument("Communicator::create: timeout must be positive, got " +
                                   std::to_string(options.timeout.count()) + " ms");
  }
  auto impl = std::make_unique<Impl>(std::move(endpoint), std::move(addresses), rank, generation, options);
  CAPSTAN_RETURN_IF_ERROR(collectives::connect_mesh(impl->mesh, impl->endpoint->impl().acceptor, generation, options));
  impl->start();
  std::unique_ptr<Communicator> group(new Communicator(std::move(impl)));
  Impl& made = *group->impl_;
  using Ring = CollectiveOptions::Ring;
  made.algorithms.set_pipelined_ring_from(options.ring == Ring::kPipelined ? 0 : collectives::Algorithms::kNever);
  if (options.ring == Ring::kAuto && size > 1) {
    // Pipelined at every size only if every rank's ring links are shared
    // memory, else from kPipelinedOverTcpFrom up: all ranks must run the
    // same algorithm, so they agree with a MIN.
    const int left = (rank + size - 1) % size, right = (rank + 1) % size;
    const int32_t mine = made.mesh.on_shm(left) && made.mesh.on_shm(right) ? 1 : 0;
    CAPSTAN_ASSIGN_OR_RETURN(Tensor all, group->all_reduce(Tensor::scalar<int32_t>(mine), ReduceOp::kMin));
    made.algorithms.set_pipelined_ring_from(all.flat<int32_t>()[0] == 1 ? 0 : kPipelinedOverTcpFrom);
  }
  return group;
}

int Communicator::rank() const { return impl_->mesh.rank; }
int Communicator::size() const { return impl_->mesh.size; }
int64_t Communicator::generation() const { return impl_->generation; }
const std::vector<std::string>& Communicator::addresses() const { return impl_->mesh.addresses; }
bool Communicator::aborted() const { return impl_->failure.aborted(); }
const std::vector<std::string>& Communicator::transports() const { return impl_->mesh.transports; }

std::string Communicator::describe() const {
  const collectives::Mesh& mesh = impl_->mesh;
  std::string out = "rank " + std::to_string(mesh.rank) + " of " + std::to_string(mesh.size) + " (generation " +
                    std::to_string(impl_->generation) + "):";
  for (int r = 0; r < mesh.size; ++r) {
    out += (r == 0 ? " " : ", ") + std::to_string(r) + " " + mesh.address(r) + " " +
           mesh.transports[static_cast<size_t>(r)];
  }
  return out;
}

void Communicator::abort(const Status& reason) {
  Impl* impl = impl_.get();
  // Aborted, whatever the reason's code: the peers' operations fail because
  // this rank gave up, not because of what they passed.
  Status why = Status::Aborted("rank " + std::to_string(impl->mesh.rank) + " aborted the group" +
                               (reason.ok() ? std::string() : ": " + reason.to_string()));
  // The running host operation sees this at its next step; an idle group
  // fails in the task below.
  impl->failure.interrupt(why);
  impl->device.interrupt(why);
  (void)impl->submit<Status>([impl, why]() { return impl->failure.abort(why); });
}

std::future<Result<Tensor>> Communicator::all_reduce_async(Tensor tensor, ReduceOp op) {
  Impl* impl = impl_.get();
  return impl->submit<Result<Tensor>>(
      [impl, tensor = std::move(tensor), op]() {
        return impl->traced<Result<Tensor>>("all_reduce", tensor.byte_size(),
                                            [&]() { return impl->algorithms.all_reduce(tensor, op); });
      });
}

std::future<Result<std::vector<Tensor>>> Communicator::all_reduce_async(std::vector<Tensor> tensors, ReduceOp op) {
  Impl* impl = impl_.get();
  return impl->submit<Result<std::vector<Tensor>>>(
      [impl, tensors = std::move(tensors), op]() {
        size_t bytes = 0;
        for (const Tensor& t : tensors) bytes += t.byte_size();
        return impl->traced<Result<std::vector<Tensor>>>(
            "all_reduce", bytes, [&]() { return impl->algorithms.all_reduce_fused(tensors, op); });
      });
}

// The blocking collectives count as the caller's all-reduce phase
// (capstan/phases.h); the asynchronous ones leave the wait to the caller.
Result<Tensor> Communicator::all_reduce(const Tensor& tensor, ReduceOp op) {
  PhaseScope phase(Phase::kCollective);
  return all_reduce_async(tensor, op).get();
}

Result<std::vector<Tensor>> Communicator::all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) {
  PhaseScope phase(Phase::kCollective);
  return all_reduce_async(tensors, op).get();
}

Result<Tensor> Communicator::broadcast(const Tensor& tensor, int root) {
  PhaseScope phase(Phase::kCollective);
  Impl* impl = impl_.get();
  return impl->submit<Result<Tensor>>([impl, &tensor, root]() {
        return impl->traced<Result<Tensor>>("broadcast", tensor.byte_size(),
                                            [&]() { return impl->algorithms.broadcast(tensor, root); });
      })
      .get();
}

Result<Tensor> Communicator::all_gather(const Tensor& tensor) {
  PhaseScope phase(Phase::kCollective);
  Impl* impl = impl_.get();
  return impl->submit<Result<Tensor>>([impl, &tensor]() {
        return impl->traced<Result<Tensor>>("all_gather", tensor.byte_size(),
                                            [&]() { return impl->algorithms.all_gather(tensor); });
      }).get();
}

Result<Tensor> Communicator::reduce_scatter(const Tensor& tensor, ReduceOp op) {
  PhaseScope phase(Phase::kCollective);
  Impl* impl = impl_.get();
  return impl->submit<Result<Tensor>>([impl, &tensor, op]() {
        return impl->traced<Result<Tensor>>("reduce_scatter", tensor.byte_size(),
                                            [&]() { return impl->algorithms.reduce_scatter(tensor, op); });
      })
      .get();
}

Status Communicator::barrier() {
  PhaseScope phase(Phase::kCollective);
  Impl* impl = impl_.get();
  return impl->submit<Status>([impl]() { return impl->traced<Status>("barrier", 0, [&]() { return impl->algorithms.barrier(); }); }).get();
}

// ---- CUDA device buffers: the device backend ----

Status Communicator::device_collectives() { return collectives::device_collectives_status(); }

bool Communicator::device_takes(DType dtype) { return collectives::nccl_takes(dtype); }

Status Communicator::all_reduce_device(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                                       int device, void* stream) {
  PhaseScope phase(Phase::kCollective);
  CAPSTAN_ASSIGN_OR_RETURN(auto* backend, impl_->device.backend(device));
  return backend->all_reduce(send, recv, count, dtype, op, stream);
}

Status Communicator::broadcast_device(void* buffer, int64_t count, DType dtype, int root, int device, void* stream) {
  PhaseScope phase(Phase::kCollective);
  CAPSTAN_ASSIGN_OR_RETURN(auto* backend, impl_->device.backend(device));
  return backend->broadcast(buffer, count, dtype, root, stream);
}

Status Communicator::all_gather_device(const void* send, void* recv, int64_t count_per_rank, DType dtype, int device,
                                       void* stream) {
  PhaseScope phase(Phase::kCollective);
  CAPSTAN_ASSIGN_OR_RETURN(auto* backend, impl_->device.backend(device));
  return backend->all_gather(send, recv, count_per_rank, dtype, stream);
}

Status Communicator::reduce_scatter_device(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                                           ReduceOp op, int device, void* stream) {
  PhaseScope phase(Phase::kCollective);
  CAPSTAN_ASSIGN_OR_RETURN(auto* backend, impl_->device.backend(device));
  return backend->reduce_scatter(send, recv, count_per_rank, dtype, op, stream);
}

}  // namespace capstan
