// The ps-server service: the ParameterServer interface of schemas/ps.capnp
// over a VariableStore and a TableStore (embedding tables). Decoding happens on the RPC loop; the store's work
// (optimizer math, copies) runs on the daemon's thread pool.
#ifndef CAPSTAN_DAEMONS_PS_SERVER_SERVICE_H_
#define CAPSTAN_DAEMONS_PS_SERVER_SERVICE_H_

#include <boost/asio/thread_pool.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "capstan_schemas/ps.capnp.h"
#include "daemons/common/node_service.h"
#include "checkpoint/manifest.h"
#include "daemons/ps_server/peer_snapshots.h"
#include "daemons/ps_server/shard_checkpoints.h"
#include "rpc/connection.h"
#include "daemons/ps_server/table_store.h"
#include "daemons/ps_server/variable_store.h"

namespace capstan::ps_server {

// Not thread-safe itself: lives on the RPC loop thread; the store is
// thread-safe and used from the pool.
class PsService : public daemon::NodeService<wire::ParameterServer::Server> {
 public:
  explicit PsService(daemon::DaemonContext& ctx);

 protected:
  kj::Promise<void> createShard(CreateShardContext context) override;
  kj::Promise<void> read(ReadContext context) override;
  kj::Promise<void> gather(GatherContext context) override;
  kj::Promise<void> assign(AssignContext context) override;
  kj::Promise<void> assignAdd(AssignAddContext context) override;
  kj::Promise<void> applyDense(ApplyDenseContext context) override;
  kj::Promise<void> applySparse(ApplySparseContext context) override;
  kj::Promise<void> listShards(ListShardsContext context) override;
  kj::Promise<void> readSlots(ReadSlotsContext context) override;
  kj::Promise<void> setSlots(SetSlotsContext context) override;
  kj::Promise<void> removeShard(RemoveShardContext context) override;
  kj::Promise<void> createTable(CreateTableContext context) override;
  kj::Promise<void> lookupTable(LookupTableContext context) override;
  kj::Promise<void> applyTable(ApplyTableContext context) override;
  kj::Promise<void> exportTable(ExportTableContext context) override;
  kj::Promise<void> importTable(ImportTableContext context) override;
  kj::Promise<void> assignRows(AssignRowsContext context) override;
  kj::Promise<void> beginSave(BeginSaveContext context) override;
  kj::Promise<void> finishSave(FinishSaveContext context) override;
  kj::Promise<void> restoreShards(RestoreShardsContext context) override;
  kj::Promise<void> sendPeerSnapshot(SendPeerSnapshotContext context) override;
  kj::Promise<void> holdPeerSnapshot(HoldPeerSnapshotContext context) override;
  kj::Promise<void> readPeerCopy(ReadPeerCopyContext context) override;
  kj::Promise<void> restoreFromPeer(RestoreFromPeerContext context) override;

 private:
  void add_table_metrics();
  // The parameter server at `address`, dialled once and kept (at most
  // kMaxPeerLinks: a buddy and a replacement's holder).
  kj::Promise<wire::ParameterServer::Client> peer(const std::string& address);

  std::shared_ptr<VariableStore> store_;
  std::shared_ptr<TableStore> tables_ = std::make_shared<TableStore>();
  const std::shared_ptr<ShardCheckpoints> checkpoints_ = std::make_shared<ShardCheckpoints>(*store_, *tables_);
  // Saves being written (beginSave) until finishSave collects them; at most
  // kMaxPendingSaves, the oldest dropped (a coordinator that died mid-save).
  static constexpr size_t kMaxPendingSaves = 16;
  std::map<uint64_t, kj::ForkedPromise<Result<checkpoint::ManifestFile>>> saves_;
  uint64_t next_save_ = 1;
  // Peer snapshots: this server's side as a source, and the copies it
  // holds of others. One sendPeerSnapshot at a time (`sending_`: another
  // is Unavailable meanwhile); `holder_` is where the last went.
  const std::shared_ptr<PeerSource> peer_source_ = std::make_shared<PeerSource>(*store_, *tables_);
  const std::shared_ptr<PeerCopies> peer_copies_ = std::make_shared<PeerCopies>(kMaxPeerCopyBytes);
  static constexpr size_t kMaxPeerCopyBytes = size_t{64} << 30;
  std::string holder_;
  bool sending_ = false;
  static constexpr size_t kMaxPeerLinks = 4;
  std::map<std::string, kj::Own<rpc::Connection>> peer_links_;
  // Writes checkpoint files, off the pool that serves training's calls.
  // Last: its threads are joined first when the service goes.
  boost::asio::thread_pool writer_{2};
};

}  // namespace capstan::ps_server

#endif  // CAPSTAN_DAEMONS_PS_SERVER_SERVICE_H_
