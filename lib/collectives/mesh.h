// The group's connections: a full mesh between the ranks, on one Boost.Asio
// io_context. Each pair of ranks has a control connection (abort notices,
// failure.h) and `tcp_streams` data connections; a pair on one host that
// can map the same shared memory also has a ShmLink (shm_link.h), and its
// data then goes through that instead (mesh_transport.h).
//
// Forming it: every rank accepts the lower ranks and dials the higher ones
// (retrying while they are not listening yet); each connection opens with a
// Hello both ways (frames.h), checked against this rank's generation, size
// and options. The dialer of a pair offers a shared-memory segment on its
// first data connection; the other side answers whether it mapped it.
//
// Thread-compatible: used by one thread at a time (the communicator's).
#ifndef CAPSTAN_LIB_COLLECTIVES_MESH_H_
#define CAPSTAN_LIB_COLLECTIVES_MESH_H_

#include <utility>  // before Asio, whose awaitable.hpp uses std::exchange

#include <boost/asio.hpp>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "capstan/collectives.h"
#include "capstan/status.h"
#include "collectives/shm_link.h"

namespace capstan {

struct CollectiveEndpoint::Impl {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor acceptor{io};
  std::string address;
};

namespace collectives {

constexpr int kMaxTcpStreams = 16;

// "1, 3": ranks for messages.
std::string ranks_text(const std::set<int>& ranks);

// The links to one other rank.
struct PeerLinks {
  std::unique_ptr<boost::asio::ip::tcp::socket> control;
  std::vector<std::unique_ptr<boost::asio::ip::tcp::socket>> data;  // `streams` of them
  std::unique_ptr<ShmLink> shm;  // set when data goes through shared memory
};

struct Mesh {
  // Unconnected sockets for every peer; `streams` is clamped to
  // [1, kMaxTcpStreams].
  Mesh(boost::asio::io_context& io, std::vector<std::string> addresses, int rank, int streams);

  boost::asio::ip::tcp::socket& channel(int peer, int channel) {
    PeerLinks& p = peers[static_cast<size_t>(peer)];
    return channel == 0 ? *p.control : *p.data[static_cast<size_t>(channel - 1)];
  }
  bool on_shm(int peer) const { return peers[static_cast<size_t>(peer)].shm != nullptr; }
  const std::string& address(int peer) const { return addresses[static_cast<size_t>(peer)]; }
  void close_all();

  // `io` belongs to the endpoint, which the owner keeps alive.
  boost::asio::io_context& io;
  const std::vector<std::string> addresses;
  const int rank;
  const int size;
  const int streams;  // TCP data connections per pair
  std::vector<PeerLinks> peers;  // by rank; this rank's entry is unused
  // Set once formed:
  std::vector<std::string> transports;  // by rank: "self", "tcp" or "shm"
  bool spin = true;  // this host's ranks (this one and its shm peers) have a core each
};

// Forms `mesh` through `acceptor` (this rank's endpoint, closed after):
// Unavailable naming the ranks missing when it is not complete within
// options.timeout, or (transport shm) the ranks that cannot share memory;
// InvalidArgument when a peer was called with other addresses, generation
// or options.
[[nodiscard]] Status connect_mesh(Mesh& mesh, boost::asio::ip::tcp::acceptor& acceptor, int64_t generation,
                                  const CollectiveOptions& options);

}  // namespace collectives
}  // namespace capstan

#endif  // CAPSTAN_LIB_COLLECTIVES_MESH_H_
