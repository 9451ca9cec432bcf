#include "rpc/sync_channel.h"

#include "async/status_exception.h"
#include "wire_names.h"

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

Status SyncChannel::connect(std::optional<wire::Role> expected) {
  try {
    return loop_.run_sync([this, expected]() -> kj::Promise<Status> {
      return connection_->node(connect_deadline()).then([this, expected](wire::Node::Client node) -> kj::Promise<Status> {
        if (!expected) return Status::Ok();
        auto info = node.infoRequest().send().then([this, expected](capnp::Response<wire::Node::InfoResults>&& r) {
          wire::Role role = r.getInfo().getRole();
          if (role == *expected) return Status::Ok();
          return Status::InvalidArgument(address_ + " is a " + std::string(role_name(role)) + ", expected a " +
                                         std::string(role_name(*expected)) + " (check the address)");
        });
        return with_deadline<Status>(loop_.timer(), kj::mv(info), options_.call_timeout, "info from " + address_);
      });
    });
  } catch (const kj::Exception& e) {
    return async::from_exception(e);
  }
}

}  // namespace capstan::rpc
