#include "rpc/sync_channel.h"

namespace capstan::rpc {
namespace {

ConnectOptions connect_options_from(const ClientOptions& options) {
  ConnectOptions connect;
  connect.token = options.token;
  connect.client_name = options.client_name;
  connect.max_message_bytes = options.max_message_bytes;
  return connect;
}

}  // namespace

SyncChannel::SyncChannel(std::string address, ClientOptions options, std::string thread_name)
    : address_(std::move(address)),
      options_(std::move(options)),
      connect_options_(connect_options_from(options_)),
      codec_(codec_options_for(options_.max_message_bytes)),
      loop_(std::move(thread_name)) {
  loop_.run_sync([this]() {
    connection_ = kj::heap<Connection>(loop_.io(), loop_.timer(), address_, connect_options_);
  });
}

SyncChannel::~SyncChannel() {
  loop_.run_sync([this]() { connection_ = nullptr; });
}

Status SyncChannel::connect() {
  try {
    loop_.run_sync([this]() { return connection_->node(connect_deadline()).ignoreResult(); });
    return Status::Ok();
  } catch (const kj::Exception& e) {
    return from_exception(e);
  }
}

}  // namespace capstan::rpc
