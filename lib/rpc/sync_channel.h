// SyncChannel: the plumbing of a blocking client (NodeClient,
// ClusterCoordinator): a async::LoopThread, one Connection to a daemon on it, and
// call(), which runs a request on the loop, bounds it by the client's
// deadlines and turns exceptions into Status.
//
// Thread-safety: call() and connect() from any thread but the loop thread;
// connection() only on the loop thread.
#ifndef CAPSTAN_LIB_RPC_SYNC_CHANNEL_H_
#define CAPSTAN_LIB_RPC_SYNC_CHANNEL_H_

#include <optional>
#include <string>

#include "capstan/client.h"
#include "rpc/connection.h"
#include "async/status_exception.h"
#include "async/loop_thread.h"
#include "rpc/tensor_codec.h"

namespace capstan::rpc {

class SyncChannel {
 public:
  SyncChannel(std::string address, ClientOptions options, std::string thread_name);
  ~SyncChannel();  // drops the connection on the loop thread

  // Connects and logs in, retrying until the connect timeout. With
  // `expected`, then checks the daemon's role: InvalidArgument "ADDR is a
  // ps, expected a coordinator" when it is another daemon.
  Status connect(std::optional<wire::Role> expected = std::nullopt);

  const std::string& address() const { return address_; }
  const ClientOptions& options() const { return options_; }
  const ConnectOptions& connect_options() const { return connect_options_; }
  const CodecOptions& codec() const { return codec_; }
  async::LoopThread& loop() { return loop_; }
  Connection& connection() { return *connection_; }  // loop thread only
  kj::TimePoint connect_deadline() {
    return loop_.timer().now() + options_.connect_timeout.count() * kj::MILLISECONDS;
  }

  // Runs make(service) on the loop, where service is the daemon's
  // `Interface` capability. `bounded`: under the call timeout (join and
  // fetch, which wait for training, are not).
  template <typename T, typename Interface, typename Make>
  Result<T> call(const std::string& what, Make make, bool bounded = true) {
    try {
      return loop_.run_sync([this, &what, &make, bounded]() -> kj::Promise<T> {
        auto promise = connection_->service<Interface>(connect_deadline())
                           .then([&make](typename Interface::Client service) { return make(service); });
        if (!bounded) return promise;
        return with_deadline<T>(loop_.timer(), kj::mv(promise), options_.call_timeout + options_.connect_timeout,
                                what + " to " + address_);
      });
    } catch (const kj::Exception& e) {
      return async::from_exception(e).with_context(what + " " + address_);
    }
  }

 private:
  const std::string address_;
  const ClientOptions options_;
  const ConnectOptions connect_options_;
  const CodecOptions codec_;
  async::LoopThread loop_;
  kj::Own<Connection> connection_;  // loop thread only
};

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_SYNC_CHANNEL_H_
