// The ps-server service: the ParameterServer interface of schemas/ps.capnp
// over a VariableStore and a TableStore (embedding tables). Decoding happens on the RPC loop; the store's work
// (optimizer math, copies) runs on the daemon's thread pool.
#ifndef CAPSTAN_DAEMONS_PS_SERVER_SERVICE_H_
#define CAPSTAN_DAEMONS_PS_SERVER_SERVICE_H_

#include <boost/asio/thread_pool.hpp>

#include <cstdint>
#include <map>
#include <memory>

#include "capstan_schemas/ps.capnp.h"
#include "daemons/common/node_service.h"
#include "checkpoint/manifest.h"
#include "daemons/ps_server/shard_checkpoints.h"
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

 private:
  void add_table_metrics();

  std::shared_ptr<VariableStore> store_;
  std::shared_ptr<TableStore> tables_ = std::make_shared<TableStore>();
  const std::shared_ptr<ShardCheckpoints> checkpoints_ = std::make_shared<ShardCheckpoints>(*store_, *tables_);
  // Saves being written (beginSave) until finishSave collects them; at most
  // kMaxPendingSaves, the oldest dropped (a coordinator that died mid-save).
  static constexpr size_t kMaxPendingSaves = 16;
  std::map<uint64_t, kj::ForkedPromise<Result<checkpoint::ManifestFile>>> saves_;
  uint64_t next_save_ = 1;
  // Writes checkpoint files, off the pool that serves training's calls.
  // Last: its threads are joined first when the service goes.
  boost::asio::thread_pool writer_{2};
};

}  // namespace capstan::ps_server

#endif  // CAPSTAN_DAEMONS_PS_SERVER_SERVICE_H_
