#include <cmath>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "capstan/data/dataset.h"
#include "async/status_exception.h"
#include "capstan/training.h"
#include "capstan_schemas/coordinator.capnp.h"
#include "rpc/errors.h"
#include "rpc/optimizer_codec.h"
#include "rpc/phase_codec.h"
#include "rpc/placement_codec.h"
#include "training/cluster_impl.h"
#include "training/initializer.h"

namespace capstan {
namespace {


VariableInfo info_from(const VariableLocation& v) {
  VariableInfo info;
  info.name = v.name;
  info.dtype = v.dtype;
  info.shape = v.shape;
  for (const auto& s : v.shards) info.shards.push_back({s.name, s.ps_task, s.ps_address, s.first_row, s.rows});
  info.embedding_table = v.table.has_value();
  return info;
}

}  // namespace

// ---- ClusterCoordinator ----------------------------------------------------------

ClusterCoordinator::ClusterCoordinator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ClusterCoordinator::~ClusterCoordinator() = default;

Result<std::unique_ptr<ClusterCoordinator>> ClusterCoordinator::connect(const std::string& address,
                                                                        ClientOptions options) {
  std::string host;
  uint16_t port = 0;
  CAPSTAN_RETURN_IF_ERROR(rpc::parse_host_port(address, &host, &port));
  auto impl = std::make_unique<Impl>(address, std::move(options));
  CAPSTAN_RETURN_IF_ERROR(impl->channel.connect(wire::Role::COORDINATOR));
  return std::unique_ptr<ClusterCoordinator>(new ClusterCoordinator(std::move(impl)));
}

namespace {

// A given value's chunks to the parameter servers: at most this many bytes
// per assignRows call.
constexpr size_t kMaxChunkBytes = size_t{64} << 20;

// What VariableSpec's comment promises: the value given once, and sound.
Status check_spec(const VariableSpec& spec) {
  const std::string what = "create_variable '" + spec.name + "': ";
  const bool has_initializer = spec.initializer.kind != Initializer::Kind::kNone;
  if (spec.initial.valid()) {
    if (has_initializer) {
      return Status::InvalidArgument(what + "both initial and initializer " +
                                     training::initializer_debug_string(spec.initializer) +
                                     " given: drop the initializer to use initial, or initial (leave it Tensor()) to "
                                     "use the initializer");
    }
    if (spec.dtype != DType::kInvalid && spec.dtype != spec.initial.dtype()) {
      return Status::InvalidArgument(what + "dtype " + std::string(dtype_name(spec.dtype)) +
                                     " disagrees with initial's " + std::string(dtype_name(spec.initial.dtype())) +
                                     ": drop dtype (initial gives it)");
    }
    if (!spec.shape.empty() && spec.shape != spec.initial.shape()) {
      return Status::InvalidArgument(what + "shape " + shape_string(spec.shape) + " disagrees with initial's " +
                                     shape_string(spec.initial.shape()) + ": drop shape (initial gives it)");
    }
    return spec.initial.validate().with_context("create_variable '" + spec.name + "'");
  }
  if (!has_initializer) {
    return Status::InvalidArgument(what + "neither initial nor initializer given: give one of them (an initializer "
                                          "with dtype and shape)");
  }
  if (spec.dtype == DType::kInvalid) {
    return Status::InvalidArgument(what + "initializer " + training::initializer_debug_string(spec.initializer) +
                                   " needs the variable's dtype (and shape; {} is a scalar)");
  }
  for (int64_t d : spec.shape) {
    if (d < 0) return Status::InvalidArgument(what + "shape " + shape_string(spec.shape) + " has a negative dim");
  }
  return training::validate_initializer(spec.initializer, spec.dtype)
      .with_context("create_variable '" + spec.name + "'");
}

void shape_to_wire(const Shape& shape, capnp::List<int64_t>::Builder out) {
  for (unsigned d = 0; d < shape.size(); ++d) out.set(d, shape[d]);
}

}  // namespace

Result<VariableInfo> ClusterCoordinator::create_variable(const VariableSpec& spec) {
  CAPSTAN_RETURN_IF_ERROR(check_spec(spec));
  Impl* impl = impl_.get();
  // A given value of rank >= 1 goes from here straight to the parameter
  // servers, in chunks (the coordinator creates the shards as zeros and
  // waits for it); a scalar's few bytes go with the request, as before.
  const bool given = spec.initial.valid();
  const bool direct = given && spec.initial.rank() >= 1 && spec.initial.byte_size() > 0;
  struct Created {
    VariableLocation location;
    bool awaiting_value = false;
  };
  auto created = impl->call<Created>("create_variable '" + spec.name + "'",
                                     [impl, &spec, given, direct](wire::Coordinator::Client c) {
    auto request = c.createVariableRequest();
    auto out = request.initSpec();
    out.setName(spec.name);
    if (direct) {
      out.setDtype(rpc::to_wire(spec.initial.dtype()));
      shape_to_wire(spec.initial.shape(), out.initShape(static_cast<unsigned>(spec.initial.shape().size())));
      out.setValueFromProgram(true);
    } else if (given) {
      rpc::write_tensor(out.initInitial(), spec.initial, impl->channel.codec());
    } else {
      rpc::initializer_to_wire(spec.initializer, out.initInitializer());
      out.setDtype(rpc::to_wire(spec.dtype));
      shape_to_wire(spec.shape, out.initShape(static_cast<unsigned>(spec.shape.size())));
    }
    rpc::optimizer_to_wire(spec.optimizer, out.initOptimizer());
    auto p = out.initPartitioner();
    p.setKind(spec.partitioner.kind);
    p.setNumShards(spec.partitioner.num_shards);
    p.setMinShardBytes(spec.partitioner.min_shard_bytes);
    p.setMaxShardBytes(spec.partitioner.max_shard_bytes);
    p.setMaxShards(spec.partitioner.max_shards);
    p.setBytesPerString(spec.partitioner.bytes_per_string);
    return request.send().then([](capnp::Response<wire::Coordinator::CreateVariableResults>&& r) {
      return Created{rpc::location_from_wire(r.getPlacement()), r.getAwaitingValue()};
    });
  });
  if (!created.ok()) return created.status();
  impl->router->remember(created->location);
  if (direct && created->awaiting_value) {
    // New (or left half-written by an earlier run of the program): write
    // it, then tell the coordinator, which stops asking for it.
    CAPSTAN_RETURN_IF_ERROR(impl->router->write_rows(created->location, spec.initial, kMaxChunkBytes)
                                .with_context("create_variable '" + spec.name + "'"));
    CAPSTAN_RETURN_IF_ERROR(impl->call<bool>("create_variable '" + spec.name + "'",
                                             [&spec](wire::Coordinator::Client c) {
                                               auto request = c.variableWrittenRequest();
                                               request.setName(spec.name);
                                               return request.send().then([](auto&&) { return true; });
                                             })
                                .status());
  }
  return info_from(created->location);
}

Result<VariableInfo> ClusterCoordinator::create_embedding_table(const EmbeddingTableSpec& spec) {
  Impl* impl = impl_.get();
  auto location = impl->call<VariableLocation>("create_embedding_table '" + spec.name + "'",
                                               [&spec](wire::Coordinator::Client c) {
    auto request = c.createEmbeddingTableRequest();
    request.setName(spec.name);
    rpc::table_to_wire(spec, request.initConfig());
    return request.send().then([](capnp::Response<wire::Coordinator::CreateEmbeddingTableResults>&& r) {
      return rpc::location_from_wire(r.getPlacement());
    });
  });
  if (!location.ok()) return location.status();
  impl->router->remember(*location);
  return info_from(*location);
}

Result<VariableInfo> ClusterCoordinator::create_embedding_table(const std::string& name, int64_t dim, DType dtype,
                                                                const EmbeddingInitializer& initializer,
                                                                const Optimizer& optimizer,
                                                                const EmbeddingTableOptions& options) {
  return create_embedding_table(EmbeddingTableSpec{name, dim, dtype, initializer, optimizer, options});
}

Result<Tensor> ClusterCoordinator::lookup(const std::string& table, const Tensor& ids, bool insert) {
  return impl_->router->lookup(table, ids, insert);
}

Result<int64_t> ClusterCoordinator::export_embedding_table(const std::string& table, const std::string& since_checkpoint,
                                                           const std::string& path) {
  return impl_->call<int64_t>("export_embedding_table '" + table + "'", [&](wire::Coordinator::Client c) {
    auto request = c.exportEmbeddingTableRequest();
    request.setName(table);
    request.setSinceCheckpoint(since_checkpoint);
    request.setPath(path);
    return request.send().then(
        [](capnp::Response<wire::Coordinator::ExportEmbeddingTableResults>&& r) { return r.getRows(); });
  });
}

Result<std::vector<VariableInfo>> ClusterCoordinator::variables() {
  return impl_->call<std::vector<VariableInfo>>("variables", [](wire::Coordinator::Client c) {
    return c.placementsRequest().send().then([](capnp::Response<wire::Coordinator::PlacementsResults>&& r) {
      std::vector<VariableInfo> out;
      for (auto v : r.getPlacements().getVariables()) out.push_back(info_from(rpc::location_from_wire(v)));
      return out;
    });
  });
}

Result<RemoteValue> ClusterCoordinator::schedule(const std::string& function, const Element& args) {
  Impl* impl = impl_.get();
  // The schedule in the flight recorder; in a trace, the start of a flow to
  // the closure's run on a worker (its id comes with the answer).
  trace::Span span(trace::Kind::kSchedule, function);
  uint64_t trace_key = 0;
  if (trace::Recorder::get().tracing()) {
    trace_key = trace::Recorder::get().new_flow_key();
    span.set_flow_key(trace_key);
  }
  // Unknown names fail here, at once (the coordinator checks again).
  bool known;
  {
    MutexLock lock(impl->names_mutex);
    known = impl->closure_names.count(function) > 0 || std::chrono::steady_clock::now() < impl->names_unknown_until;
  }
  if (!known) {
    auto names = impl->call<std::vector<std::string>>("schedule '" + function + "'", [](wire::Coordinator::Client c) {
      return c.closureNamesRequest().send().then([](capnp::Response<wire::Coordinator::ClosureNamesResults>&& r) {
        std::vector<std::string> out;
        for (auto n : r.getNames()) out.emplace_back(n.cStr());
        return out;
      });
    });
    if (!names.ok()) return names.status();
    MutexLock lock(impl->names_mutex);
    impl->closure_names.insert(names->begin(), names->end());
    // No worker yet: the names stay unknown for a while, and asking at
    // every schedule() would make each one a blocking round trip (a
    // program scheduling ahead of its workers ran 10x slower).
    if (names->empty()) impl->names_unknown_until = std::chrono::steady_clock::now() + Impl::kNamesUnknownFor;
    // With no worker registered yet, any name may still arrive with one.
    if (!names->empty() && impl->closure_names.count(function) == 0) {
      std::string all;
      for (const auto& n : impl->closure_names) all += (all.empty() ? "" : ", ") + n;
      return Status::NotFound("schedule: no worker has a closure named '" + function + "' (workers have: " + all + ")");
    }
  }
  Status error = impl->take_schedule_error();
  if (!error.ok()) return error;
  // Backpressure (see Impl::outstanding); a few threads at once may pass
  // the bound together, by one each.
  for (int64_t n = impl->outstanding.load(); n >= Impl::kMaxOutstanding; n = impl->outstanding.load()) {
    impl->outstanding.wait(n);
  }
  impl->outstanding.fetch_add(1);
  int64_t local = impl->next_local_id.fetch_add(1);
  // Encoded here, on the program's thread: the loop thread and the
  // coordinator pass the bytes on as they are.
  Impl::Args payload;
  const size_t limit = impl->channel.codec().inline_limit;
  size_t raw = 0;
  for (const Tensor& t : args.components) raw += t.byte_size();
  if (raw <= limit) payload.encoded = rpc::element_to_bytes(args);
  if (payload.encoded.empty() || payload.encoded.size() > limit) {
    payload.encoded.clear();
    payload.element = args;
  }
  bool posted = impl->loop().post([impl, local, function, payload = std::move(payload), trace_key]() mutable {
    impl->enqueue_schedule(local, std::move(function), std::move(payload), trace_key);
  });
  if (!posted) {
    impl->outstanding.fetch_sub(1);
    return Status::Unavailable("schedule: the client's event loop has stopped");
  }
  RemoteValue value(local);
  value.holder_ = std::make_shared<RemoteValue::Holder>(impl->dropped, local);
  return value;
}

// Sends what schedule() queued in one scheduleMany call (several, past the
// coordinator's limit per call).
void ClusterCoordinator::Impl::flush_schedules() {
  while (!pending_schedules.empty()) {
    // The closures of one call (enqueue_schedule grouped them).
    auto sent = pending_schedules.front().batch;
    size_t n = 0;
    while (n < pending_schedules.size() && pending_schedules[n].batch == sent) ++n;
    auto batch = std::make_shared<std::vector<PendingSchedule>>();
    batch->reserve(n);
    for (size_t i = 0; i < n; ++i) batch->push_back(std::move(pending_schedules[i]));
    pending_schedules.erase(pending_schedules.begin(), pending_schedules.begin() + static_cast<ptrdiff_t>(n));
    // The values dropped meanwhile ride along (sent again with a retry).
    take_dropped();
    auto releases = std::make_shared<std::vector<int64_t>>(take_releases(kMaxReleasesPerCall));
    const uint64_t release_incarnation = incarnation;
    auto send = [this, batch, sent, releases, release_incarnation]() {
      return connection().service<wire::Coordinator>(connect_deadline()).then([this, batch, sent, releases, release_incarnation](wire::Coordinator::Client c) {
        auto request = c.scheduleManyRequest();
        request.setClientId(client_id);
        if (!releases->empty()) {
          auto out = request.initReleases(static_cast<unsigned>(releases->size()));
          for (unsigned i = 0; i < releases->size(); ++i) out.set(i, (*releases)[i]);
          request.setReleaseIncarnation(release_incarnation);
        }
        last_heard = loop().timer().now();
        auto entries = request.initEntries(static_cast<unsigned>(batch->size()));
        rpc::ReferenceBudget references;
        const rpc::CodecOptions codec = rpc::with_references(channel.codec(), &references);
        for (unsigned i = 0; i < batch->size(); ++i) {
          const PendingSchedule& p = (*batch)[i];
          entries[i].setFunction(p.function);
          if (p.args.element) {
            rpc::write_element(entries[i].initArgs(), *p.args.element, codec);
          } else {
            entries[i].setEncodedArgs(
                kj::arrayPtr(reinterpret_cast<const kj::byte*>(p.args.encoded.data()), p.args.encoded.size()));
          }
          entries[i].setRequestSeq(p.local);
        }
        auto call = request.send();
        // A retry's fetches wait for the ids instead.
        if (!sent->was_sent() && pipelined.count(batch->front().local) > 0) sent->values = call.getValues();
        sent->mark_sent();
        return call.then([this, batch](capnp::Response<wire::Coordinator::ScheduleManyResults>&& r) {
          durable = r.getDurable();
          if (r.getIncarnation() != incarnation) {
            // Another coordinator process: the ids waiting for release
            // are of the one before (see queue_release).
            incarnation = r.getIncarnation();
            pending_releases.clear();
          }
          auto outcomes = r.getOutcomes();
          if (outcomes.size() != batch->size()) {
            async::throw_status(Status::Internal("the coordinator answered " + std::to_string(outcomes.size()) +
                                               " outcomes for " + std::to_string(batch->size()) + " closures"));
          }
          for (unsigned i = 0; i < outcomes.size(); ++i) {
            auto& id = (*batch)[i].id;
            if (!id->isWaiting()) continue;
            if (outcomes[i].isClosureId()) {
              id->fulfill(outcomes[i].getClosureId());
            } else {
              id->reject(async::to_exception(rpc::status_from_wire(outcomes[i].getError())));
            }
          }
        });
      });
    };
    auto answered = [this, batch, sent]() {
      // Fetches from now on go by closure id; the coordinator's object for
      // the call goes once the fetches on their way have their answers.
      sent->values = nullptr;
      sent->mark_sent();
      for (const auto& p : *batch) pipelined.erase(p.local);
    };
    tasks->add(retrying<void>(kj::mv(send)).then(kj::cp(answered), [this, batch, answered, releases, release_incarnation](kj::Exception&& e) {
      answered();
      // The link broke: released with a later call (see send_releases).
      if (e.getType() == kj::Exception::Type::DISCONNECTED && release_incarnation == incarnation) {
        pending_releases.insert(pending_releases.end(), releases->begin(), releases->end());
      }
      // The call failed as a whole: every closure of it did.
      for (auto& p : *batch) {
        if (p.id->isWaiting()) p.id->reject(kj::cp(e));
      }
    }));
  }
}

Status ClusterCoordinator::join() {
  Impl* impl = impl_.get();
  try {
    impl->loop().run_sync([impl]() {
      return impl->all_acked().then([impl]() {
        async::check(impl->take_schedule_error());
        // What the program let go goes before the join (a program that
        // joins and then sits idle holds nothing it dropped).
        impl->send_releases(/*heartbeat=*/false);
        return impl->retrying<void>([impl]() {
          return impl->connection()
              .service<wire::Coordinator>(impl->connect_deadline())
              .then([](wire::Coordinator::Client c) { return c.joinRequest().send().ignoreResult(); });
        });
      });
    });
    return Status::Ok();
  } catch (const kj::Exception& e) {
    return async::from_exception(e);
  }
}

Result<bool> ClusterCoordinator::done() {
  Impl* impl = impl_.get();
  try {
    return impl->loop().run_sync([impl]() {
      return impl->all_acked()
          .then([impl]() {
            async::check(impl->take_schedule_error());
            return impl->retrying<bool>([impl]() {
              return impl->connection()
                  .service<wire::Coordinator>(impl->connect_deadline())
                  .then([](wire::Coordinator::Client c) { return c.doneRequest().send(); })
                  .then([](capnp::Response<wire::Coordinator::DoneResults>&& r) { return r.getDone(); });
            });
          });
    });
  } catch (const kj::Exception& e) {
    return async::from_exception(e);
  }
}

Result<Element> ClusterCoordinator::fetch(const RemoteValue& value) {
  Impl* impl = impl_.get();
  try {
    return impl->loop().run_sync([impl, &value]() { return impl->fetch_value(value.id); });
  } catch (const kj::Exception& e) {
    return async::from_exception(e);
  }
}

Result<Element> ClusterCoordinator::fetch_once(const RemoteValue& value) {
  Impl* impl = impl_.get();
  const int64_t local = value.id;
  try {
    return impl->loop().run_sync([impl, local]() {
      return impl->fetch_value(local).then([impl, local](Element element) {
        impl->release_local(local, /*dropped=*/false);
        return element;
      });
    });
  } catch (const kj::Exception& e) {
    return async::from_exception(e);
  }
}

namespace {

// A fetch's answer: the value as the worker encoded it (decoded here, once,
// on its way to the program), or, past the coordinator's inline limit, an
// element whose tensors are pulled in chunks.
template <typename Results>
kj::Promise<Element> value_of(capnp::Response<Results>&& r) {
  if (r.hasEncodedValue()) {
    auto bytes = r.getEncodedValue();
    auto element = rpc::element_from_bytes(std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size()));
    if (!element.ok()) return async::to_exception(element.status().with_context("fetch: the value the coordinator sent"));
    return kj::mv(*element);
  }
  return rpc::read_element(r.getValue()).attach(kj::mv(r));
}

}  // namespace

kj::Promise<Element> ClusterCoordinator::Impl::fetch_value(int64_t local) {
  auto it = scheduled.find(local);
  if (it == scheduled.end()) {
    return async::to_exception(Status::NotFound("no scheduled closure " + std::to_string(local)));
  }
  if (it->second.released) {
    return async::to_exception(Status::NotFound("closure " + std::to_string(local) +
                                              " was released after fetch_once: its value is no longer kept; use "
                                              "fetch() to fetch a value more than once"));
  }
  auto by_id = [this, local]() -> kj::Promise<Element> {
    auto entry = scheduled.find(local);
    if (entry == scheduled.end()) {
      return async::to_exception(Status::NotFound("no scheduled closure " + std::to_string(local)));
    }
    return entry->second.id_promise.addBranch().then([this](int64_t id) {
      return retrying<Element>([this, id]() {
        return connection()
            .service<wire::Coordinator>(connect_deadline())
            .then([id](wire::Coordinator::Client c) {
              auto request = c.fetchRequest();
              request.setClosureId(id);
              request.setEncoded(true);
              return request.send();
            })
            .then([](capnp::Response<wire::Coordinator::FetchResults>&& r) { return value_of(kj::mv(r)); });
      });
    });
  };
  auto pipe = pipelined.find(local);
  if (pipe != pipelined.end()) {
    std::shared_ptr<SentBatch> batch = pipe->second.batch;
    if (!batch->was_sent()) {
      // schedule() was just called: the fetch rides on the call once it
      // is sent (in this turn of the loop, or after a reconnect).
      return batch->sent.addBranch().then([this, local]() { return fetch_value(local); });
    }
    KJ_IF_MAYBE (values, batch->values) {
      // The schedule call has no answer yet: the fetch rides on it.
      auto request = values->fetchRequest();
      request.setIndex(pipe->second.index);
      request.setEncoded(true);
      return request.send()
          .then([](capnp::Response<wire::ClosureValues::FetchResults>&& r) { return value_of(kj::mv(r)); })
          .catch_([by_id](kj::Exception&& e) -> kj::Promise<Element> {
            // The link broke under the call (a retry schedules it again):
            // wait for the closure id and fetch by it.
            if (e.getType() == kj::Exception::Type::DISCONNECTED) return by_id();
            return kj::mv(e);
          });
    }
  }
  return by_id();
}

// ---- Releases ----------------------------------------------------------------------

void ClusterCoordinator::Impl::release_local(int64_t local, bool dropped) {
  auto it = scheduled.find(local);
  if (it == scheduled.end()) return;
  Scheduled& entry = it->second;
  if (!entry.released) {
    entry.released = true;
    if (entry.answered) queue_release(entry);
  }
  entry.dropped = entry.dropped || dropped;
  // Before the answer the entry waits for the id (schedule_answered).
  if (entry.dropped && entry.answered) scheduled.erase(it);
}

void ClusterCoordinator::Impl::schedule_answered(int64_t local, int64_t id) {
  auto it = scheduled.find(local);
  if (it == scheduled.end()) return;
  Scheduled& entry = it->second;
  entry.answered = true;
  entry.id = id;
  entry.incarnation = incarnation;
  if (entry.released) queue_release(entry);
  if (entry.dropped) scheduled.erase(it);
}

void ClusterCoordinator::Impl::queue_release(const Scheduled& entry) {
  if (entry.id != 0 && entry.incarnation == incarnation) pending_releases.push_back(entry.id);
}

void ClusterCoordinator::Impl::take_dropped() {
  for (int64_t local : dropped->take()) {
    // An entry goes only after its value was dropped, and a value is
    // dropped once: no entry means its schedule() is still on its way.
    if (scheduled.count(local) > 0) {
      release_local(local, /*dropped=*/true);
    } else {
      dropped_early.insert(local);
    }
  }
}

std::vector<int64_t> ClusterCoordinator::Impl::take_releases(size_t max) {
  if (pending_releases.size() <= max) return std::exchange(pending_releases, {});
  std::vector<int64_t> out(pending_releases.begin(), pending_releases.begin() + static_cast<ptrdiff_t>(max));
  pending_releases.erase(pending_releases.begin(), pending_releases.begin() + static_cast<ptrdiff_t>(max));
  return out;
}

void ClusterCoordinator::Impl::send_releases(bool heartbeat) {
  take_dropped();
  if (releasing) return;  // the call on its way sends the rest when it ends
  if (pending_releases.empty() && (!heartbeat || loop().timer().now() - last_heard < kHeartbeat)) return;
  releasing = true;
  last_heard = loop().timer().now();
  auto ids = std::make_shared<std::vector<int64_t>>(take_releases(kMaxReleasesPerCall));
  const uint64_t of = incarnation;
  tasks->add(connection()
                 .service<wire::Coordinator>(connect_deadline())
                 .then([this, ids, of](wire::Coordinator::Client c) {
                   auto request = c.releaseRequest();
                   request.setClientId(client_id);
                   request.setIncarnation(of);
                   auto out = request.initClosureIds(static_cast<unsigned>(ids->size()));
                   for (unsigned i = 0; i < ids->size(); ++i) out.set(i, (*ids)[i]);
                   return request.send().ignoreResult();
                 })
                 .then(
                     [this]() {
                       releasing = false;
                       if (!pending_releases.empty()) send_releases(/*heartbeat=*/false);
                     },
                     [this, ids, of](kj::Exception&& e) {
                       releasing = false;
                       // A broken link: sent again with a later call (a
                       // release is idempotent) unless the coordinator is
                       // another process now. Refused: dropped, not sent
                       // again and again.
                       if (e.getType() == kj::Exception::Type::DISCONNECTED && of == incarnation) {
                         pending_releases.insert(pending_releases.end(), ids->begin(), ids->end());
                       }
                     }));
}

kj::Promise<void> ClusterCoordinator::Impl::release_timer() {
  return loop().timer().afterDelay(kReleaseDelay).then([this]() {
    send_releases(/*heartbeat=*/true);
    return release_timer();
  });
}

Result<PerWorkerDataset> ClusterCoordinator::create_per_worker_dataset(const data::Dataset& dataset) {
  return create_per_worker_dataset(dataset, "");
}

Result<PerWorkerDataset> ClusterCoordinator::create_per_worker_dataset(const data::Dataset& dataset,
                                                                       const std::string& name) {
  std::string definition = dataset.serialize();
  return impl_->call<PerWorkerDataset>("create_per_worker_dataset", [&definition, &name](wire::Coordinator::Client c) {
    auto request = c.createPerWorkerDatasetRequest();
    request.setDefinition(kj::arrayPtr(reinterpret_cast<const kj::byte*>(definition.data()), definition.size()));
    request.setName(name);
    return request.send().then([](capnp::Response<wire::Coordinator::CreatePerWorkerDatasetResults>&& r) {
      return PerWorkerDataset{r.getDatasetId()};
    });
  });
}

Result<std::string> ClusterCoordinator::save_checkpoint(const std::string& directory, int64_t step,
                                                        int max_to_keep) {
  return impl_->call<std::string>("save_checkpoint", [&](wire::Coordinator::Client c) {
    auto request = c.saveCheckpointRequest();
    request.setDirectory(directory);
    request.setStep(step);
    request.setMaxToKeep(max_to_keep);
    return request.send().then([](capnp::Response<wire::Coordinator::SaveCheckpointResults>&& r) {
      return std::string(r.getPath().cStr());
    });
  }, /*bounded=*/false);
}

Result<int64_t> ClusterCoordinator::restore_checkpoint(const std::string& path) {
  CAPSTAN_ASSIGN_OR_RETURN(RestoreResult restored, restore_checkpoint(path, /*strict=*/false));
  return restored.step;
}

Result<ClusterCoordinator::RestoreResult> ClusterCoordinator::restore_checkpoint(const std::string& path, bool strict) {
  return impl_->call<RestoreResult>("restore_checkpoint", [&](wire::Coordinator::Client c) {
    auto request = c.restoreCheckpointRequest();
    request.setPath(path);
    request.setStrict(strict);
    return request.send().then([](capnp::Response<wire::Coordinator::RestoreCheckpointResults>&& r) {
      RestoreResult out;
      out.step = r.getStep();
      for (auto name : r.getNotInCheckpoint()) out.not_in_checkpoint.emplace_back(name.cStr());
      return out;
    });
  }, /*bounded=*/false);
}

Result<PerWorkerDataset> ClusterCoordinator::create_per_worker_dataset(const std::string& dataset_function) {
  return create_per_worker_dataset(dataset_function, std::string());
}

Result<PerWorkerDataset> ClusterCoordinator::create_per_worker_dataset(const std::string& dataset_function,
                                                                       const std::string& name) {
  return impl_->call<PerWorkerDataset>("create_per_worker_dataset '" + dataset_function + "'",
                                       [&dataset_function, &name](wire::Coordinator::Client c) {
    auto request = c.createPerWorkerDatasetFromFunctionRequest();
    request.setFunction(dataset_function);
    request.setName(name);
    return request.send().then([](capnp::Response<wire::Coordinator::CreatePerWorkerDatasetFromFunctionResults>&& r) {
      return PerWorkerDataset{r.getDatasetId()};
    });
  });
}

Result<Tensor> ClusterCoordinator::read_variable(const std::string& name) { return impl_->router->read(name); }

Status ClusterCoordinator::assign_variable(const std::string& name, const Tensor& value) {
  return impl_->router->assign(name, value);
}

Result<Tensor> ClusterCoordinator::gather(const std::string& name, const Tensor& ids) {
  return impl_->router->gather(name, ids);
}

Status ClusterCoordinator::apply_gradients(const std::string& name, const Tensor& gradient) {
  return impl_->router->apply_dense(name, gradient);
}

Status ClusterCoordinator::apply_sparse_gradients(const std::string& name, const Tensor& ids, const Tensor& rows) {
  return impl_->router->apply_sparse(name, ids, rows);
}

int ClusterCoordinator::num_workers() {
  auto n = impl_->call<int>("num_workers", [](wire::Coordinator::Client c) {
    return c.numWorkersRequest().send().then([](capnp::Response<wire::Coordinator::NumWorkersResults>&& r) {
      return static_cast<int>(r.getCount());
    });
  });
  return n.ok() ? *n : 0;
}

Result<ClusterStats> ClusterCoordinator::worker_stats() {
  return impl_->call<ClusterStats>("worker_stats", [](wire::Coordinator::Client c) {
    return c.workerStatsRequest().send().then([](capnp::Response<wire::Coordinator::WorkerStatsResults>&& r) {
      ClusterStats stats;
      for (auto w : r.getWorkers()) {
        WorkerStats& out = stats.workers.emplace_back();
        out.task_index = w.getTaskIndex();
        out.address = w.getAddress();
        out.runs = w.getRuns();
        out.phases = rpc::phases_from_wire(w);
        out.busy_seconds = w.getBusy();
        if (std::isfinite(w.getScore())) out.straggler_score = w.getScore();
        out.straggler = w.getStraggler();
      }
      stats.totals = rpc::phases_from_wire(r.getTotals());
      return stats;
    });
  });
}

Status ClusterCoordinator::report_scalar(const std::string& tag, double value, int64_t step) {
  return impl_
      ->call<bool>("report_scalar",
                   [tag, value, step](wire::Coordinator::Client c) {
                     auto request = c.reportScalarsRequest();
                     auto scalar = request.initScalars(1)[0];
                     scalar.setTag(tag);
                     scalar.setValue(value);
                     scalar.setStep(step);
                     return request.send().then([](auto&&) { return true; });
                   })
      .status();
}

Result<std::unique_ptr<Communicator>> ClusterCoordinator::join_group(const std::string& name, int size, int rank,
                                                                     const std::string& host,
                                                                     CollectiveOptions options) {
  CAPSTAN_ASSIGN_OR_RETURN(std::unique_ptr<CollectiveEndpoint> endpoint, CollectiveEndpoint::listen(host));
  struct Joined {
    int64_t generation = 0;
    int rank = 0;
    std::vector<std::string> addresses;
  };
  const std::string address = endpoint->address();
  // The coordinator holds the call until the group forms or its timeout
  // passes, so the call itself has no client-side deadline.
  auto joined = impl_->call<Joined>(
      "joining collective group '" + name + "'",
      [&](wire::Coordinator::Client c) {
        auto request = c.joinGroupRequest();
        request.setName(name);
        request.setSize(size);
        request.setRank(rank);
        request.setAddress(address);
        request.setTimeoutMs(options.timeout.count());
        return request.send().then([](capnp::Response<wire::Coordinator::JoinGroupResults>&& r) {
          Joined out;
          out.generation = r.getGeneration();
          out.rank = r.getRank();
          for (auto a : r.getAddresses()) out.addresses.emplace_back(a.cStr());
          return out;
        });
      },
      /*bounded=*/false);
  if (!joined.ok()) return joined.status();
  if (joined->rank < 0 || joined->rank >= static_cast<int>(joined->addresses.size()) ||
      joined->addresses[static_cast<size_t>(joined->rank)] != address) {
    return Status::Internal("the coordinator's group '" + name + "' does not list this process (" + address +
                            ") as rank " + std::to_string(joined->rank));
  }
  return Communicator::create(std::move(endpoint), std::move(joined->addresses), joined->rank, joined->generation,
                              options);
}

}  // namespace capstan
