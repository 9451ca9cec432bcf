#include "capstan/client.h"

#include <algorithm>
#include <limits>

#include "rpc/sync_channel.h"
#include "rpc/trace_codec.h"
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

Result<NodeClient::ClockOffset> NodeClient::clock_offset(int rounds) {
  ClockOffset best{0, std::numeric_limits<int64_t>::max()};
  for (int i = 0; i < std::max(rounds, 1); ++i) {
    const int64_t sent = trace::now_ns();
    auto asked = [](wire::Node::Client node) {
      return node.clockRequest().send().then(
          [](capnp::Response<wire::Node::ClockResults>&& response) { return response.getNowNs(); });
    };
    CAPSTAN_ASSIGN_OR_RETURN(int64_t remote, (impl_->channel.call<int64_t, wire::Node>("clock", asked)));
    const int64_t received = trace::now_ns();
    if (received - sent < best.round_trip_ns) {
      best.round_trip_ns = received - sent;
      best.offset_ns = remote - (sent + (received - sent) / 2);
    }
  }
  return best;
}

Result<trace::TraceCapture> NodeClient::trace(double seconds, size_t max_events) {
  return impl_->channel.call<trace::TraceCapture, wire::Node>(
      "trace",
      [this, seconds, max_events](wire::Node::Client node) {
        auto request = node.traceRequest();
        request.setSeconds(seconds);
        request.setMaxEvents(static_cast<uint32_t>(std::min<size_t>(max_events, UINT32_MAX)));
        auto reply = request.send().then([](capnp::Response<wire::Node::TraceResults>&& response) {
          trace::TraceCapture capture;
          capture.events.reserve(response.getEvents().size());
          for (auto e : response.getEvents()) capture.events.push_back(rpc::event_from_wire(e));
          for (auto t : response.getThreads()) capture.threads.push_back({t.getIndex(), t.getName().cStr()});
          capture.dropped = response.getDropped();
          capture.start_ns = response.getStartNs();
          capture.end_ns = response.getEndNs();
          return capture;
        });
        // The daemon answers after `seconds`: the deadline starts then.
        auto& loop = impl_->channel.loop();
        return rpc::with_deadline<trace::TraceCapture>(
            loop.timer(), kj::mv(reply),
            impl_->channel.options().call_timeout + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1e3)),
            "trace");
      },
      /*bounded=*/false);
}

Result<NodeClient::Flight> NodeClient::flight() {
  return impl_->channel.call<Flight, wire::Node>("flight", [](wire::Node::Client node) {
    return node.flightRequest().send().then([](capnp::Response<wire::Node::FlightResults>&& response) {
      Flight flight;
      for (auto r : response.getRecords()) flight.records.push_back(rpc::flight_from_wire(r));
      flight.now_ns = response.getNowNs();
      flight.capacity = response.getCapacity();
      return flight;
    });
  });
}

}  // namespace capstan
