#include "capstan/client.h"

#include "rpc/sync_channel.h"
#include "wire_names.h"

namespace capstan {

const char* version() { return CAPSTAN_VERSION; }

struct NodeClient::Impl {
  Impl(std::string address, ClientOptions options)
      : channel(std::move(address), std::move(options), "capstan-client") {}
  rpc::SyncChannel channel;
};

NodeClient::NodeClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeClient::~NodeClient() = default;

Result<std::unique_ptr<NodeClient>> NodeClient::connect(const std::string& address,
                                                        ClientOptions options) {
  std::string host;
  uint16_t port = 0;
  CAPSTAN_RETURN_IF_ERROR(rpc::parse_host_port(address, &host, &port));
  auto impl = std::make_unique<Impl>(address, std::move(options));
  CAPSTAN_RETURN_IF_ERROR(impl->channel.connect());
  return std::unique_ptr<NodeClient>(new NodeClient(std::move(impl)));
}

Result<NodeInfo> NodeClient::info() {
  return impl_->channel.call<NodeInfo, wire::Node>("info", [](wire::Node::Client node) {
    return node.infoRequest().send().then([](capnp::Response<wire::Node::InfoResults>&& response) {
      auto in = response.getInfo();
      NodeInfo info;
      info.role = std::string(role_name(in.getRole()));
      info.task_index = in.getTaskIndex();
      info.version = in.getVersion().cStr();
      info.uptime_seconds = in.getUptimeSeconds();
      info.rpc_address = in.getRpcAddress().cStr();
      info.http_port = in.getHttpPort();
      info.pid = in.getPid();
      info.ready = in.getReady();
      info.gpu_count = in.getGpuCount();
      return info;
    });
  });
}

Result<Element> NodeClient::echo(const Element& element) {
  rpc::SyncChannel& channel = impl_->channel;
  return channel.call<Element, wire::Node>("echo", [&channel, &element](wire::Node::Client node) {
    auto request = node.echoRequest();
    rpc::write_element(request.initElement(), element, channel.codec());
    return request.send().then([](capnp::Response<wire::Node::EchoResults>&& response) {
      return rpc::read_element(response.getElement()).attach(kj::mv(response));
    });
  });
}

Result<uint64_t> NodeClient::discard(const Element& element) {
  rpc::SyncChannel& channel = impl_->channel;
  return channel.call<uint64_t, wire::Node>("discard", [&channel, &element](wire::Node::Client node) {
    auto request = node.discardRequest();
    rpc::write_element(request.initElement(), element, channel.codec());
    return request.send().then([](capnp::Response<wire::Node::DiscardResults>&& response) {
      return response.getByteCount();
    });
  });
}

}  // namespace capstan
