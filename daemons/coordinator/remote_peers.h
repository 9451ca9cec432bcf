// The coordinator's peers over Cap'n Proto: the WorkerPeer and
// ParameterServers of coordinator.h, wrapping the generated clients.
// Exceptions from a call become Status values here; a worker call that fails
// because the link broke (async::is_transport_failure) reports a lost worker.
//
// Not thread-safe: they live on the RPC loop thread, with the Coordinator.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_REMOTE_PEERS_H_
#define CAPSTAN_DAEMONS_COORDINATOR_REMOTE_PEERS_H_

#include <set>
#include <string>
#include <vector>

#include "capstan_schemas/ps.capnp.h"
#include "async/status_exception.h"
#include "capstan_schemas/worker.capnp.h"
#include "daemons/coordinator/coordinator.h"
#include "rpc/connection.h"
#include "rpc/tensor_codec.h"

namespace capstan::coordinator {

class RemoteWorker : public WorkerPeer {
 public:
  RemoteWorker(wire::Worker::Client client, rpc::CodecOptions codec, std::string address = {});
  ~RemoteWorker() noexcept override;
  std::string address() const override { return address_; }

  kj::Promise<ClosureOutcome> run_closure(ClosureRun run) override;
  // One runClosures call; a worker without it (UNIMPLEMENTED: older than
  // the call) gets the runs one by one from then on.
  kj::Promise<std::vector<ClosureOutcome>> run_closures(std::vector<ClosureRun> runs) override;
  kj::Promise<Status> cancel_closure(int64_t closure_id) override;
  kj::Promise<Status> ping() override;
  kj::Promise<Status> create_dataset(int64_t dataset_id, std::string definition, uint64_t uid) override;
  kj::Promise<Status> create_dataset_from_function(int64_t dataset_id, std::string function, int num_workers,
                                                   int worker_index, uint64_t uid) override;
  kj::Promise<Result<training::ReplicaReport>> replica_status(std::string strategy) override;
  kj::Promise<Result<std::string>> prepare_replica(std::string strategy, int64_t epoch) override;
  kj::Promise<Result<training::ReplicaReport>> form_replica(training::ReplicaForm form) override;
  kj::Promise<Result<training::MirroredState>> read_replica(std::string strategy) override;
  kj::Promise<Result<training::SavedReplica>> save_replica(std::string strategy, std::string directory) override;
  kj::Promise<Status> abort_replica(std::string strategy, int64_t epoch, std::string reason) override;
  kj::Promise<Result<std::string>> save_iterator(int64_t dataset_id) override;
  kj::Promise<Status> restore_iterator(int64_t dataset_id, std::string state) override;

 private:
  std::string address_;
  wire::Worker::Client client_;
  const rpc::CodecOptions codec_;
  bool batches_ = true;  // the worker answers runClosures
};

// One connection per parameter server, reconnecting on demand.
class RemoteParameterServers : public ParameterServers {
 public:
  RemoteParameterServers(kj::AsyncIoProvider& io, kj::Timer& timer, const std::vector<std::string>& addresses,
                         const rpc::ConnectOptions& options, rpc::CodecOptions codec);
  ~RemoteParameterServers();

  int size() const override { return static_cast<int>(connections_.size()); }
  std::string address(int task) const override;
  kj::Promise<void> reachable(int task) override;
  kj::Promise<void> unreachable(int task) override;
  kj::Promise<Status> create_shard(int task, std::string name, Tensor initial,
                                   const Optimizer& optimizer) override;
  kj::Promise<Status> create_initialized_shard(int task, std::string name, InitializedShard shard,
                                               const Optimizer& optimizer) override;
  kj::Promise<Result<std::set<std::string>>> list_shards(int task) override;
  kj::Promise<Status> create_table(int task, std::string name, EmbeddingTableSpec spec) override;
  kj::Promise<Result<TableContents>> export_table(int task, std::string name, int64_t since, int64_t begin) override;
  kj::Promise<Result<SaveStarted>> begin_save(int task, std::string directory, std::string file,
                                              std::vector<ps::SaveItem> items) override;
  kj::Promise<Result<checkpoint::ManifestFile>> finish_save(int task, uint64_t save_id) override;
  kj::Promise<Status> restore_shards(int task, std::string path, std::vector<ps::RestoreItem> items) override;
  kj::Promise<Result<PeerSent>> send_peer_snapshot(int task, std::string holder, bool full) override;
  kj::Promise<Result<PeerRestored>> restore_from_peer(int task, std::string holder, int source_task,
                                                      std::vector<std::string> shards) override;

 private:
  // The service of `task`, connecting until `timeout` from now.
  kj::Promise<wire::ParameterServer::Client> service(int task, kj::Duration timeout);

  kj::Timer& timer_;
  const rpc::CodecOptions codec_;
  std::vector<kj::Own<rpc::Connection>> connections_;  // by task
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_REMOTE_PEERS_H_
