#include "rpc/connection.h"

#include <kj/debug.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "async/status_exception.h"
#include "rpc/http_sniff_stream.h"
#include "rpc/link_timeout.h"
#include "rpc/message_stream.h"

namespace capstan::rpc {

struct Connection::Link {
  Link(kj::Own<kj::AsyncIoStream> stream, capnp::ReaderOptions reader_options)
      : stream(kj::mv(stream)),
        messages(*this->stream),
        network(messages, capnp::rpc::twoparty::Side::CLIENT, reader_options),
        rpc(capnp::makeRpcClient(network)),
        disconnected(network.onDisconnect().fork()) {}

  wire::Gate::Client gate() {
    capnp::word scratch[4];
    memset(scratch, 0, sizeof(scratch));
    capnp::MallocMessageBuilder message(scratch);
    auto vat_id = message.getRoot<capnp::rpc::twoparty::VatId>();
    vat_id.setSide(capnp::rpc::twoparty::Side::SERVER);
    return rpc.bootstrap(vat_id).castAs<wire::Gate>();
  }

  kj::Own<kj::AsyncIoStream> stream;
  MessageStream messages;  // large received messages in shareable buffers
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
  kj::ForkedPromise<void> disconnected;
  wire::Node::Client node = nullptr;
};

namespace {

// TLS from CAPSTAN_TLS_CA etc., read once per process.
const Result<std::shared_ptr<Tls>>& environment_tls() {
  static const Result<std::shared_ptr<Tls>> tls = Tls::client_from_environment();
  return tls;
}

ConnectOptions with_environment_tls(ConnectOptions options, Status* error) {
  if (options.tls) return options;
  const auto& tls = environment_tls();
  if (tls.ok()) {
    options.tls = *tls;
  } else {
    *error = tls.status();
  }
  return options;
}

}  // namespace

Connection::Connection(kj::AsyncIoProvider& io, kj::Timer& timer, std::string address,
                       ConnectOptions options)
    : io_(io),
      timer_(timer),
      address_(std::move(address)),
      options_(with_environment_tls(std::move(options), &tls_error_)) {}

Connection::~Connection() = default;

kj::Promise<void> Connection::on_disconnect() {
  if (link_.get() == nullptr) return kj::READY_NOW;
  return link_->disconnected.addBranch();
}

void Connection::reset() {
  watch_ = nullptr;
  link_ = nullptr;
  pending_ = nullptr;
}

kj::Promise<wire::Node::Client> Connection::node(kj::TimePoint deadline) {
  if (link_.get() != nullptr) return link_->node;
  KJ_IF_MAYBE(pending, pending_) {
    if (!*pending_settled_) return pending->addBranch();
    // It ended, but the caller that would have cleared it was cancelled
    // first (a dropped request): a failed attempt must not be handed out
    // again forever, so start another.
    pending_ = nullptr;
  }
  auto settled = std::make_shared<bool>(false);
  auto forked = attempt(deadline, 1, options_.initial_backoff)
                    .then(
                        [settled](wire::Node::Client node) {
                          *settled = true;
                          return node;
                        },
                        [settled](kj::Exception&& e) -> wire::Node::Client {
                          *settled = true;
                          kj::throwFatalException(kj::mv(e));
                        })
                    .fork();
  auto branch = forked.addBranch();
  pending_ = kj::mv(forked);
  pending_settled_ = kj::mv(settled);
  // Clear the shared attempt whichever way it ends, so a later call retries.
  return branch.then(
      [this](wire::Node::Client node) {
        pending_ = nullptr;
        return node;
      },
      [this](kj::Exception&& e) -> wire::Node::Client {
        pending_ = nullptr;
        kj::throwFatalException(kj::mv(e));
      });
}

kj::Promise<wire::Node::Client> Connection::attempt(kj::TimePoint deadline, int attempt_number,
                                                    std::chrono::milliseconds backoff) {
  // One attempt may not hang forever on a peer that accepts the connection
  // but never answers the login.
  auto limit = std::min(options_.attempt_timeout,
                        std::chrono::milliseconds(std::max<int64_t>(
                            1, (deadline - timer_.now()) / kj::MILLISECONDS)));
  return with_deadline(timer_, connect_once(), limit, "connecting to " + address_).catch_([this, deadline, attempt_number,
                                backoff](kj::Exception&& e) -> kj::Promise<wire::Node::Client> {
    Status error = async::from_exception(e);
    // A refused token or a peer that speaks another protocol will not get
    // better by retrying.
    if (error.code() == StatusCode::kUnauthenticated || error.code() == StatusCode::kInvalidArgument) {
      return async::to_exception(error);
    }
    auto now = timer_.now();
    if (now >= deadline) {
      return async::to_exception(Status::Unavailable("cannot reach " + address_ + " after " +
                                              std::to_string(attempt_number) +
                                              " attempts: " + error.message()));
    }
    // Full jitter keeps restarting clients from reconnecting in lockstep.
    static thread_local std::mt19937 rng(std::random_device{}());
    auto jittered = std::chrono::milliseconds(
        std::uniform_int_distribution<int64_t>(backoff.count() / 2, backoff.count())(rng));
    auto remaining = std::chrono::milliseconds((deadline - now) / kj::MILLISECONDS);
    auto delay = std::min(jittered, remaining);
    if (retry_logger_) retry_logger_(error, delay, attempt_number);
    auto next = std::min(backoff * 2, options_.max_backoff);
    return timer_.afterDelay(delay.count() * kj::MILLISECONDS)
        .then([this, deadline, attempt_number, next]() {
          return attempt(deadline, attempt_number + 1, next);
        });
  });
}

namespace {

// True when the socket's local and peer addresses are the same.
bool connected_to_itself(kj::AsyncIoStream& stream) {
  struct sockaddr_storage local {};
  struct sockaddr_storage peer {};
  kj::uint local_len = sizeof(local);
  kj::uint peer_len = sizeof(peer);
  try {
    stream.getsockname(reinterpret_cast<struct sockaddr*>(&local), &local_len);
    stream.getpeername(reinterpret_cast<struct sockaddr*>(&peer), &peer_len);
  } catch (const kj::Exception&) {
    return false;  // not a socket
  }
  return local_len == peer_len && std::memcmp(&local, &peer, local_len) == 0;
}

}  // namespace

kj::Promise<wire::Node::Client> Connection::connect_once() {
  std::string host;
  uint16_t port = 0;
  Status parsed = parse_host_port(address_, &host, &port);
  if (!parsed.ok()) return async::to_exception(parsed);
  if (!tls_error_.ok()) return async::to_exception(tls_error_);
  return io_.getNetwork()
      .parseAddress(kj::StringPtr(host.c_str()), port)
      .then([](kj::Own<kj::NetworkAddress>&& addr) { return addr->connect().attach(kj::mv(addr)); })
      .then([this, host](kj::Own<kj::AsyncIoStream>&& stream) -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
        if (connected_to_itself(*stream)) {
          // TCP simultaneous open: with the daemon down and its port in the
          // ephemeral range, a retry can get that very port as its local
          // one and "connect" to itself, which would keep the daemon from
          // listening there again. Drop it and retry like a refusal.
          kj::throwFatalException(KJ_EXCEPTION(DISCONNECTED, "connected to itself: nothing listens there"));
        }
        set_link_timeout(*stream, options_.link_timeout);
        tune_loopback_link(*stream);
        kj::Own<kj::AsyncIoStream> checked = kj::heap<HttpSniffStream>(kj::mv(stream), address_);
        if (!options_.tls) return kj::mv(checked);
        return options_.tls->wrap_client(kj::mv(checked), host);
      })
      .then([this](kj::Own<kj::AsyncIoStream>&& stream) {
        auto link = kj::heap<Link>(kj::mv(stream), reader_options_for(options_.max_message_bytes));
        auto request = link->gate().loginRequest();
        request.setToken(options_.token);
        request.setClientName(options_.client_name);
        return request.send().then(
            [this, link = kj::mv(link)](capnp::Response<wire::Gate::LoginResults>&& response) mutable {
              link->node = response.getNode();
              link_ = kj::mv(link);
              // Forget the link when it breaks so the next call reconnects.
              Link* raw = link_.get();
              watch_ = raw->disconnected.addBranch()
                           .then([this, raw]() {
                             if (link_.get() == raw) link_ = nullptr;
                           })
                           .eagerlyEvaluate(nullptr);
              return link_->node;
            });
      });
}

Status parse_host_port(const std::string& address, std::string* host, uint16_t* port) {
  if (size_t scheme = address.find("://"); scheme != std::string::npos) {
    return Status::InvalidArgument("address '" + address + "' is a URL; RPC addresses are host:port of the " +
                                   "daemon's RPC port (--port), without '" + address.substr(0, scheme + 3) +
                                   "' (the http port serves the status page, /healthz, /readyz and /metrics)");
  }
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return Status::InvalidArgument("address '" + address + "' is not host:port");
  }
  std::string h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  std::string p = address.substr(colon + 1);
  if (p.find_first_not_of("0123456789") != std::string::npos || p.size() > 5 ||
      std::stoul(p) > 65535 || std::stoul(p) == 0) {
    return Status::InvalidArgument("address '" + address + "' has an invalid port '" + p + "'");
  }
  *host = h;
  *port = static_cast<uint16_t>(std::stoul(p));
  return Status::Ok();
}

}  // namespace capstan::rpc
