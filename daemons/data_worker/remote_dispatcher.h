// The data worker's DispatcherPeer over Cap'n Proto: wraps the dispatcher's
// generated client behind a reconnecting rpc::Connection. Exceptions from a
// call become Status values here (async::from_exception keeps the codes that
// say "retry"); each call connects within kConnectTimeout and answers within
// kCallTimeout.
//
// Not thread-safe: lives on the RPC loop thread, with the DataWorker.
#ifndef CAPSTAN_DAEMONS_DATA_WORKER_REMOTE_DISPATCHER_H_
#define CAPSTAN_DAEMONS_DATA_WORKER_REMOTE_DISPATCHER_H_

#include <chrono>
#include <string>
#include <vector>

#include "daemons/data_worker/data_worker.h"
#include "async/status_exception.h"
#include "rpc/connection.h"

namespace capstan::data_worker {

class RemoteDispatcher final : public DispatcherPeer {
 public:
  static constexpr std::chrono::seconds kConnectTimeout{5};
  static constexpr std::chrono::seconds kCallTimeout{10};

  // `timer` must outlive this.
  RemoteDispatcher(kj::AsyncIoProvider& io, kj::Timer& timer, std::string address,
                   const rpc::ConnectOptions& options);
  ~RemoteDispatcher() noexcept override;

  std::string address() const override { return connection_->address(); }
  kj::Promise<Result<HeartbeatReply>> worker_heartbeat(std::string worker_address,
                                                       std::vector<int64_t> current_tasks) override;
  kj::Promise<Result<std::optional<Element>>> get_split(SplitRequest request) override;
  kj::Promise<Status> finish_task(std::string worker_address, int64_t task_id) override;

 private:
  kj::Promise<wire::DataDispatcher::Client> service();

  kj::Timer& timer_;
  kj::Own<rpc::Connection> connection_;
};

}  // namespace capstan::data_worker

#endif  // CAPSTAN_DAEMONS_DATA_WORKER_REMOTE_DISPATCHER_H_
