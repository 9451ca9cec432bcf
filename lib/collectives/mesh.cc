#include "collectives/mesh.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <thread>

#include "collectives/frames.h"

namespace capstan {
namespace collectives {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using Transport = CollectiveOptions::Transport;

Result<tcp::endpoint> parse_endpoint(const std::string& address) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return Status::InvalidArgument("collective address '" + address + "' is not host:port");
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  boost::system::error_code ec;
  auto ip = asio::ip::make_address(host, ec);
  if (ec) {
    asio::io_context io;
    tcp::resolver resolver(io);
    auto found = resolver.resolve(host, address.substr(colon + 1), ec);
    if (ec || found.empty()) {
      return Status::InvalidArgument("collective address '" + address + "': cannot resolve '" + host + "'");
    }
    return found.begin()->endpoint();
  }
  char* end = nullptr;
  long port = std::strtol(address.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535) {
    return Status::InvalidArgument("collective address '" + address + "' has no valid port");
  }
  return tcp::endpoint(ip, static_cast<uint16_t>(port));
}

// One run of connect_mesh: the handshakes in flight, on mesh.io. Lower
// ranks are accepted (each sends a Hello, this rank answers with its own);
// higher ranks are dialed, retrying while they are not listening yet.
class MeshBuilder {
 public:
  MeshBuilder(Mesh& mesh, tcp::acceptor& acceptor, int64_t generation, const CollectiveOptions& options)
      : mesh_(mesh),
        acceptor_(acceptor),
        generation_(generation),
        options_(options),
        deadline_(Clock::now() + options.timeout),
        channels_(1 + mesh.streams),
        offer_shm_(options.transport != Transport::kTcp),
        channels_done_(static_cast<size_t>(mesh.size), 0),
        offered_(static_cast<size_t>(mesh.size)),
        targets_(static_cast<size_t>(mesh.size)),
        accepts_left_(channels_ * mesh.rank) {
    for (int peer = 0; peer < mesh.size; ++peer) {
      if (peer != mesh.rank) missing_.insert(peer);
    }
  }

  Status run();

 private:
  void channel_done(int peer) {
    if (++channels_done_[static_cast<size_t>(peer)] == channels_) missing_.erase(peer);
  }
  Hello hello(int channel) const {
    Hello h;
    h.rank = mesh_.rank;
    h.size = mesh_.size;
    h.channel = channel;
    h.generation = generation_;
    h.streams = mesh_.streams;
    h.segment_bytes = options_.segment_bytes;
    return h;
  }
  void accept_next();
  void accepted(std::shared_ptr<tcp::socket> socket, const Hello& hello);
  Status mismatched_hello(const Hello& hello) const;
  void connect(int peer, int channel);
  void connected(int peer, int channel);
  void answered(int peer, int channel, const Hello& reply);
  Status finish(Status result);

  Mesh& mesh_;
  tcp::acceptor& acceptor_;
  const int64_t generation_;
  const CollectiveOptions& options_;
  const Clock::time_point deadline_;
  const int channels_;
  const bool offer_shm_;
  Status failure_;
  std::set<int> missing_;  // ranks whose connections are not complete
  std::vector<int> channels_done_;
  // Shared-memory segments this rank offered, by peer, until answered.
  std::vector<std::unique_ptr<ShmLink>> offered_;
  std::string shm_trouble_;  // why an offer could not be made or mapped (for kSharedMemory's error)
  std::vector<tcp::endpoint> targets_;
  int accepts_left_;
};

void MeshBuilder::accept_next() {
  if (accepts_left_ == 0) return;
  --accepts_left_;
  auto socket = std::make_shared<tcp::socket>(mesh_.io);
  acceptor_.async_accept(*socket, [this, socket](boost::system::error_code ec) {
    if (ec) {
      if (failure_.ok()) failure_ = Status::Unavailable("accepting collective peers: " + ec.message());
      return;
    }
    accept_next();
    auto hello = std::make_shared<Hello>();
    asio::async_read(*socket, asio::buffer(hello.get(), sizeof(Hello)),
                     [this, socket, hello](boost::system::error_code ec2, size_t) {
                       if (ec2 || hello->magic != kMagic) {
                         ++accepts_left_;  // not a peer: accept another
                         accept_next();
                         return;
                       }
                       accepted(socket, *hello);
                     });
  });
}

Status MeshBuilder::mismatched_hello(const Hello& hello) const {
  return Status::InvalidArgument(
      "a peer called as rank " + std::to_string(hello.rank) + " of " + std::to_string(hello.size) +
      " (generation " + std::to_string(hello.generation) + ", " + std::to_string(hello.streams) +
      " TCP stream(s) of " + std::to_string(hello.segment_bytes) + "-byte segments), but this is rank " +
      std::to_string(mesh_.rank) + " of " + std::to_string(mesh_.size) + " (generation " +
      std::to_string(generation_) + ", " + std::to_string(mesh_.streams) + " TCP stream(s) of " +
      std::to_string(options_.segment_bytes) +
      "-byte segments): every rank must pass the same addresses, generation and options");
}

void MeshBuilder::accepted(std::shared_ptr<tcp::socket> socket, const Hello& hello) {
  if (hello.generation != generation_ || hello.size != mesh_.size || hello.rank < 0 || hello.rank >= mesh_.rank ||
      hello.channel < 0 || hello.channel >= channels_ || hello.streams != mesh_.streams ||
      hello.segment_bytes != options_.segment_bytes) {
    if (failure_.ok()) failure_ = mismatched_hello(hello);
    return;
  }
  const int from = hello.rank;
  tcp::socket& slot = mesh_.channel(from, hello.channel);
  slot = std::move(*socket);
  auto reply = std::make_shared<Hello>(this->hello(hello.channel));
  if (hello.shm_name[0] != '\0' && offer_shm_) {
    std::string name(hello.shm_name.data(), strnlen(hello.shm_name.data(), hello.shm_name.size()));
    auto link = ShmLink::open(name, hello.shm_token, hello.shm_capacity);
    if (link.ok()) {
      mesh_.peers[static_cast<size_t>(from)].shm = std::move(*link);
      reply->shm_ok = 1;
    } else if (shm_trouble_.empty()) {
      shm_trouble_ = "rank " + std::to_string(from) + "'s segment: " + link.status().message();
    }
  }
  asio::async_write(slot, asio::buffer(reply.get(), sizeof(Hello)),
                    [this, reply, from](boost::system::error_code ec, size_t) {
                      if (!ec) channel_done(from);
                    });
}

void MeshBuilder::connect(int peer, int channel) {
  mesh_.channel(peer, channel).async_connect(targets_[static_cast<size_t>(peer)],
                                             [this, peer, channel](boost::system::error_code ec) {
    if (!ec) return connected(peer, channel);
    boost::system::error_code ignored;
    mesh_.channel(peer, channel).close(ignored);
    auto timer = std::make_shared<asio::steady_timer>(mesh_.io, std::chrono::milliseconds(20));
    timer->async_wait([this, timer, peer, channel](boost::system::error_code) {
      if (Clock::now() < deadline_) connect(peer, channel);
    });
  });
}

void MeshBuilder::connected(int peer, int channel) {
  auto hello = std::make_shared<Hello>(this->hello(channel));
  if (channel == 1 && offer_shm_ && !offered_[static_cast<size_t>(peer)]) {
    auto link = ShmLink::create(static_cast<size_t>(std::max<int64_t>(options_.shm_buffer_bytes, 0)));
    if (link.ok()) {
      const std::string& name = (*link)->name();
      std::memcpy(hello->shm_name.data(), name.data(), std::min(name.size(), hello->shm_name.size() - 1));
      hello->shm_token = (*link)->token();
      hello->shm_capacity = (*link)->capacity();
      offered_[static_cast<size_t>(peer)] = std::move(*link);
    } else if (shm_trouble_.empty()) {
      shm_trouble_ = link.status().message();
    }
  }
  tcp::socket& s = mesh_.channel(peer, channel);
  asio::async_write(s, asio::buffer(hello.get(), sizeof(Hello)),
                    [this, hello, peer, channel](boost::system::error_code ec, size_t) {
                      if (ec) return;
                      auto reply = std::make_shared<Hello>();
                      asio::async_read(mesh_.channel(peer, channel), asio::buffer(reply.get(), sizeof(Hello)),
                                       [this, reply, peer, channel](boost::system::error_code ec2, size_t) {
                                         if (ec2) reply->magic = 0;
                                         answered(peer, channel, *reply);
                                       });
                    });
}

void MeshBuilder::answered(int peer, int channel, const Hello& reply) {
  if (reply.magic != kMagic || reply.rank != peer || reply.generation != generation_) {
    if (failure_.ok()) {
      failure_ = Status::Unavailable("the collective peer at " + mesh_.address(peer) + " did not answer as rank " +
                                     std::to_string(peer) + " of generation " + std::to_string(generation_));
    }
    return;
  }
  auto& link = offered_[static_cast<size_t>(peer)];
  if (channel == 1 && link) {
    link->unlink();  // mapped on both sides, or never will be
    if (reply.shm_ok == 1) mesh_.peers[static_cast<size_t>(peer)].shm = std::move(link);
    link.reset();
  }
  channel_done(peer);
}

Status MeshBuilder::run() {
  for (int peer = mesh_.rank + 1; peer < mesh_.size; ++peer) {
    CAPSTAN_ASSIGN_OR_RETURN(targets_[static_cast<size_t>(peer)], parse_endpoint(mesh_.address(peer)));
  }
  accept_next();
  for (int peer = mesh_.rank + 1; peer < mesh_.size; ++peer) {
    for (int channel = 0; channel < channels_; ++channel) connect(peer, channel);
  }
  mesh_.io.restart();
  while (!missing_.empty() && failure_.ok()) {
    if (mesh_.io.run_one_until(deadline_) == 0) break;
  }
  Status result = failure_;
  if (result.ok() && !missing_.empty()) {
    result = Status::Unavailable("forming the collective group (generation " + std::to_string(generation_) + ", " +
                                 std::to_string(mesh_.size) + " ranks): rank(s) " + ranks_text(missing_) +
                                 " did not connect within " + std::to_string(options_.timeout.count()) + " ms");
  }
  return finish(result);
}

// Stops what is left (accepts, retries), lets their handlers run, and
// settles each peer's transport.
Status MeshBuilder::finish(Status result) {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  if (!result.ok()) mesh_.close_all();
  mesh_.io.restart();
  mesh_.io.run();
  offered_.clear();  // unanswered offers: their names go
  if (!result.ok()) return result;
  mesh_.transports.assign(static_cast<size_t>(mesh_.size), "tcp");
  mesh_.transports[static_cast<size_t>(mesh_.rank)] = "self";
  std::set<int> not_shared;
  for (int peer = 0; peer < mesh_.size; ++peer) {
    if (peer == mesh_.rank) continue;
    PeerLinks& p = mesh_.peers[static_cast<size_t>(peer)];
    if (options_.transport == Transport::kTcp) p.shm.reset();
    if (p.shm) {
      mesh_.transports[static_cast<size_t>(peer)] = "shm";
    } else {
      not_shared.insert(peer);
    }
    p.control->set_option(tcp::no_delay(true), ignored);
    for (auto& s : p.data) s->set_option(tcp::no_delay(true), ignored);
  }
  const auto local_ranks = static_cast<unsigned>(1 + (mesh_.size - 1) - static_cast<int>(not_shared.size()));
  mesh_.spin = local_ranks <= std::max(1u, std::thread::hardware_concurrency());
  if (options_.transport == Transport::kSharedMemory && !not_shared.empty()) {
    mesh_.close_all();
    return Status::Unavailable("transport shm: rank(s) " + ranks_text(not_shared) +
                               " cannot share memory with rank " + std::to_string(mesh_.rank) +
                               (shm_trouble_.empty() ? std::string(" (another host, or another /dev/shm)")
                                                     : " (" + shm_trouble_ + ")") +
                               "; use transport auto (shared memory where it can, TCP elsewhere) or tcp");
  }
  return Status::Ok();
}

}  // namespace

std::string ranks_text(const std::set<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

Mesh::Mesh(asio::io_context& io_in, std::vector<std::string> addresses_in, int rank_in, int streams_in)
    : io(io_in),
      addresses(std::move(addresses_in)),
      rank(rank_in),
      size(static_cast<int>(addresses.size())),
      streams(std::clamp(streams_in, 1, kMaxTcpStreams)) {
  peers.resize(static_cast<size_t>(size));
  for (auto& p : peers) {
    p.control = std::make_unique<tcp::socket>(io);
    for (int s = 0; s < streams; ++s) p.data.push_back(std::make_unique<tcp::socket>(io));
  }
}

void Mesh::close_all() {
  boost::system::error_code ignored;
  for (auto& p : peers) {
    p.control->close(ignored);
    for (auto& s : p.data) s->close(ignored);
  }
}

Status connect_mesh(Mesh& mesh, tcp::acceptor& acceptor, int64_t generation, const CollectiveOptions& options) {
  MeshBuilder builder(mesh, acceptor, generation, options);
  return builder.run();
}

}  // namespace collectives
}  // namespace capstan
