#include "capstan/strategy.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "capstan/data/dataset.h"
#include "collectives/reduce.h"
#include "rpc/optimizer_codec.h"
#include "rpc/replica_codec.h"
#include "rpc/tensor_codec.h"
#include "training/cluster_impl.h"

namespace capstan {

namespace {

// A call whose link broke is sent again once the client has reconnected
// when the coordinator is durable (ClusterCoordinator::Impl::retrying);
// each attempt bounded as SyncChannel::call bounds one. For calls that
// change nothing, or that the coordinator answers the same when sent
// twice (createStrategy hands back the strategy it has).
// (`Coordinator` is ClusterCoordinator::Impl, which only MirroredStrategy
// may name.)
template <typename T, typename Coordinator, typename Make>
Result<T> call_durable(Coordinator& coordinator, const std::string& what, Make make) {
  try {
    return coordinator.loop().run_sync([&coordinator, &what, &make]() {
      return coordinator.template retrying<T>([&coordinator, &what, &make]() {
        const auto& options = coordinator.channel.options();
        auto attempt = coordinator.connection()
                           .template service<wire::Coordinator>(coordinator.connect_deadline())
                           .then([&make](wire::Coordinator::Client c) { return make(c); });
        return rpc::with_deadline<T>(coordinator.loop().timer(), kj::mv(attempt),
                                     options.call_timeout + options.connect_timeout,
                                     what + " to " + coordinator.channel.address());
      });
    });
  } catch (const kj::Exception& e) {
    return async::from_exception(e).with_context(what + " " + coordinator.channel.address());
  }
}

}  // namespace

struct MirroredStrategy::Impl {
  ClusterCoordinator& cluster;
  std::string name;
  int replicas_in_sync = 0;
};

MirroredStrategy::MirroredStrategy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MirroredStrategy::~MirroredStrategy() = default;

const std::string& MirroredStrategy::name() const { return impl_->name; }
int MirroredStrategy::num_replicas_in_sync() const { return impl_->replicas_in_sync; }

Result<std::unique_ptr<MirroredStrategy>> MirroredStrategy::create(ClusterCoordinator& cluster,
                                                                   std::vector<MirroredVariableSpec> variables,
                                                                   StrategyOptions options) {
  training::CollectiveSettings settings;
  settings.timeout = options.collective.timeout;
  settings.transport = options.collective.transport;
  settings.tcp_streams = options.collective.tcp_streams;
  auto& coordinator = *cluster.impl_;
  CAPSTAN_RETURN_IF_ERROR(call_durable<bool>(
      coordinator, "creating strategy '" + options.name + "'", [&](wire::Coordinator::Client c) {
        auto request = c.createStrategyRequest();
        request.setName(options.name);
        request.getOptions().setMinReplicas(options.min_replicas);
        rpc::settings_to_wire(settings, request.getOptions().initSettings());
        auto list = request.initVariables(static_cast<unsigned>(variables.size()));
        rpc::ReferenceBudget references;
        const rpc::CodecOptions codec = rpc::with_references(cluster.impl_->channel.codec(), &references);
        for (unsigned i = 0; i < variables.size(); ++i) {
          list[i].setName(variables[i].name);
          rpc::write_tensor(list[i].initInitial(), variables[i].initial, codec);
          rpc::optimizer_to_wire(variables[i].optimizer, list[i].initOptimizer());
        }
        return request.send().then([&coordinator](capnp::Response<wire::Coordinator::CreateStrategyResults>&& r) {
          // Closures and strategies alike: calls over a broken link are
          // sent again once reconnected (loop thread).
          coordinator.durable = r.getDurable();
          return true;
        });
      }).status());
  auto impl = std::make_unique<Impl>(Impl{cluster, options.name});
  return std::unique_ptr<MirroredStrategy>(new MirroredStrategy(std::move(impl)));
}

Result<PerReplica> MirroredStrategy::run(const std::string& function, const Element& args) {
  auto& coordinator = *impl_->cluster.impl_;
  const std::string what = "step of strategy '" + impl_->name + "' (" + function + ")";
  auto step = [&](wire::Coordinator::Client c) {
        auto request = c.runStepRequest();
        request.setStrategy(impl_->name);
        request.setFunction(function);
        rpc::write_element(request.initArgs(), args, coordinator.channel.codec());
        return request.send().then([](capnp::Response<wire::Coordinator::RunStepResults>&& r) {
          auto out = kj::heap<PerReplica>();
          out->step = r.getStep();
          out->epoch = r.getEpoch();
          for (int32_t t : r.getTaskIndexes()) out->task_indexes.push_back(t);
          for (int64_t n : r.getExamples()) out->examples.push_back(n);
          out->input_position = r.getInputPosition();
          out->values.resize(r.getValues().size());
          auto reads = kj::heapArrayBuilder<kj::Promise<void>>(r.getValues().size());
          for (unsigned i = 0; i < r.getValues().size(); ++i) {
            PerReplica* raw = out.get();
            reads.add(rpc::read_element(r.getValues()[i]).then([raw, i](Element&& e) { raw->values[i] = std::move(e); }));
          }
          PerReplica* raw = out.get();
          return kj::joinPromises(reads.finish()).then([raw]() { return std::move(*raw); }).attach(kj::mv(out));
        });
  };
  // Not sent again after the link broke: the step may have run on the
  // workers, and its values are gone with the coordinator. Unbounded: a
  // step takes as long as the closure does.
  Result<PerReplica> out = Status::Unknown("");
  try {
    out = coordinator.loop().run_sync([&]() {
      return coordinator.connection()
          .service<wire::Coordinator>(coordinator.connect_deadline())
          .then([&step](wire::Coordinator::Client c) { return step(c); })
          .catch_([&](kj::Exception&& e) -> kj::Promise<PerReplica> {
            // (A lost worker's Unavailable is the coordinator's answer,
            // not a broken link.)
            if (e.getType() != kj::Exception::Type::DISCONNECTED || !async::is_transport_failure(e) ||
                !coordinator.durable) {
              return kj::mv(e);
            }
            // A durable coordinator restarts with the strategy: wait until
            // it answers again, so that the next run() goes straight on.
            const std::string name = impl_->name;
            return coordinator
                .retrying<bool>([&coordinator, name]() {
                  return coordinator.connection()
                      .service<wire::Coordinator>(coordinator.connect_deadline())
                      .then([name](wire::Coordinator::Client c) {
                        auto request = c.strategyStatusRequest();
                        request.setStrategy(name);
                        return request.send().ignoreResult();
                      })
                      .then([]() { return true; });
                })
                .then(
                    [](bool) -> kj::Promise<PerReplica> {
                      return async::to_exception(Status::Unavailable(
                          "the link to the coordinator broke during the step, and the coordinator restarted: the "
                          "step's outcome was lost (the replicas may have applied it); run() again goes on from "
                          "the last step every replica finished"));
                    },
                    [](kj::Exception&& again) -> kj::Promise<PerReplica> {
                      return async::to_exception(async::from_exception(again).with_context(
                          "the link to the coordinator broke during the step; reconnecting"));
                    });
          });
    });
  } catch (const kj::Exception& e) {
    out = async::from_exception(e).with_context(what + " " + coordinator.channel.address());
  }
  if (out.ok()) impl_->replicas_in_sync = static_cast<int>(out->values.size());
  return out;
}

Result<Tensor> MirroredStrategy::reduce(ReduceOp op, const PerReplica& values, size_t component) {
  if (values.values.empty()) return Status::InvalidArgument("reduce: no per-replica values (no step ran)");
  const Tensor* first = nullptr;
  for (size_t r = 0; r < values.values.size(); ++r) {
    const auto& components = values.values[r].components;
    if (component >= components.size()) {
      return Status::InvalidArgument("reduce: replica " + std::to_string(r) + " returned " +
                                     std::to_string(components.size()) + " component(s), not a component " +
                                     std::to_string(component));
    }
    const Tensor& t = components[component];
    if (first == nullptr) first = &t;
    if (t.dtype() != first->dtype() || t.shape() != first->shape()) {
      return Status::InvalidArgument("reduce: replica " + std::to_string(r) + "'s value is " +
                                     std::string(dtype_name(t.dtype())) + shape_string(t.shape()) + ", replica 0's " +
                                     std::string(dtype_name(first->dtype())) + shape_string(first->shape()));
    }
  }
  CAPSTAN_RETURN_IF_ERROR(collectives::check_reducible(first->dtype(), "reduce"));
  const bool widened = collectives::reduces_widened(first->dtype());
  auto wide = [&](const Tensor& t) -> Result<Tensor> {
    if (widened) return collectives::widen(t);
    CAPSTAN_ASSIGN_OR_RETURN(Tensor copy, Tensor::uninitialized(t.dtype(), t.shape()));
    if (t.byte_size() > 0) std::memcpy(copy.mutable_data(), t.data(), t.byte_size());
    return copy;
  };
  // In replica order, as the collectives reduce.
  CAPSTAN_ASSIGN_OR_RETURN(Tensor acc, wide(*first));
  for (size_t r = 1; r < values.values.size(); ++r) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor next, wide(values.values[r].components[component]));
    collectives::reduce_into(acc.dtype(), op, acc.mutable_data(), next.data(), acc.num_elements());
  }
  if (op == ReduceOp::kMean) {
    collectives::finish_mean(acc.dtype(), acc.mutable_data(), acc.num_elements(),
                             static_cast<int>(values.values.size()));
  }
  if (widened) return collectives::narrow(acc, first->dtype());
  return acc;
}

Result<Tensor> MirroredStrategy::read_variable(const std::string& name) {
  auto& coordinator = *impl_->cluster.impl_;
  return call_durable<Tensor>(coordinator, "reading mirrored variable '" + name + "'", [&](wire::Coordinator::Client c) {
    auto request = c.readMirroredRequest();
    request.setStrategy(impl_->name);
    request.setName(name);
    return request.send().then([](capnp::Response<wire::Coordinator::ReadMirroredResults>&& r) {
      return rpc::read_tensor(r.getValue());
    });
  });
}

Result<std::vector<ReplicaStatus>> MirroredStrategy::replicas() {
  auto& coordinator = *impl_->cluster.impl_;
  return call_durable<std::vector<ReplicaStatus>>(
      coordinator, "status of strategy '" + impl_->name + "'", [&](wire::Coordinator::Client c) {
        auto request = c.strategyStatusRequest();
        request.setStrategy(impl_->name);
        return request.send().then([](capnp::Response<wire::Coordinator::StrategyStatusResults>&& r) {
          std::vector<ReplicaStatus> out;
          for (auto replica : r.getReplicas()) {
            ReplicaStatus s;
            s.worker_id = replica.getWorkerId();
            s.task_index = replica.getTaskIndex();
            s.rank = replica.getRank();
            s.holds = replica.getHolds();
            s.step = replica.getStep();
            s.checksum = replica.getChecksum();
            s.error = replica.getError().cStr();
            out.push_back(std::move(s));
          }
          return out;
        });
      });
}

Status MirroredStrategy::verify_replicas() {
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<ReplicaStatus> all, replicas());
  if (all.empty()) {
    return Status::FailedPrecondition("strategy '" + impl_->name + "' has no replicas yet (no step has run)");
  }
  std::map<std::pair<uint64_t, int64_t>, int> votes;
  for (const auto& r : all) {
    if (r.error.empty() && r.holds) ++votes[{r.checksum, r.step}];
  }
  std::string bad;
  const auto majority = std::max_element(votes.begin(), votes.end(),
                                         [](const auto& a, const auto& b) { return a.second < b.second; });
  for (const auto& r : all) {
    std::string why;
    if (!r.error.empty()) {
      why = r.error;
    } else if (!r.holds) {
      why = "holds no replica";
    } else if (majority != votes.end() && std::make_pair(r.checksum, r.step) != majority->first) {
      why = "checksum " + std::to_string(r.checksum) + " at step " + std::to_string(r.step);
    }
    if (!why.empty()) {
      bad += (bad.empty() ? "" : "; ") + std::string("replica ") + std::to_string(r.rank) + " (worker " +
             std::to_string(r.worker_id) + ", task " + std::to_string(r.task_index) + "): " + why;
    }
  }
  if (bad.empty()) return Status::Ok();
  return Status::DataLoss("the replicas of strategy '" + impl_->name + "' differ: " + bad);
}

Result<PerWorkerDataset> MirroredStrategy::distribute_dataset(const data::Dataset& dataset) {
  return impl_->cluster.create_per_worker_dataset(dataset);
}

Result<PerWorkerDataset> MirroredStrategy::distribute_step_input(const data::Dataset& examples,
                                                                StepInputOptions options) {
  std::string definition = examples.serialize();
  return impl_->cluster.impl_->call<PerWorkerDataset>(
      "distributing the step input of strategy '" + impl_->name + "'", [&](wire::Coordinator::Client c) {
        auto request = c.distributeStepInputRequest();
        request.setStrategy(impl_->name);
        request.setDefinition(kj::arrayPtr(reinterpret_cast<const kj::byte*>(definition.data()), definition.size()));
        request.setGlobalBatch(options.global_batch);
        request.setPerReplicaBatch(options.per_replica_batch);
        request.setSeed(options.seed);
        request.setShuffle(options.shuffle);
        return request.send().then([](capnp::Response<wire::Coordinator::DistributeStepInputResults>&& r) {
          return PerWorkerDataset{r.getDatasetId()};
        });
      });
}

Result<PerWorkerDataset> MirroredStrategy::distribute_datasets_from_function(const std::string& dataset_function) {
  return impl_->cluster.create_per_worker_dataset(dataset_function);
}

Result<std::string> MirroredStrategy::save_checkpoint(const std::string& directory, int64_t step, int max_to_keep) {
  return impl_->cluster.save_checkpoint(directory, step, max_to_keep);
}

Result<int64_t> MirroredStrategy::restore_checkpoint(const std::string& path) {
  return impl_->cluster.restore_checkpoint(path);
}

}  // namespace capstan
