// One exchange in flight over the mesh (mesh_transport.h): what its TCP
// half (tcp_transport.h) and its shared-memory half (shm_transport.h) share.
// Lives on the stack of MeshTransport::exchange; not thread-safe (the
// exchange's thread runs both halves and every Asio handler).
#ifndef CAPSTAN_LIB_COLLECTIVES_EXCHANGE_H_
#define CAPSTAN_LIB_COLLECTIVES_EXCHANGE_H_

#include <functional>
#include <set>
#include <vector>

#include "capstan/status.h"
#include "collectives/failure.h"
#include "collectives/mesh.h"
#include "collectives/transport.h"

namespace capstan::collectives {

struct ExchangeState {
  ExchangeState(Mesh& mesh_in, std::vector<Send>& sends_in, std::vector<Recv>& recvs_in)
      : mesh(mesh_in), sends(sends_in), recvs(recvs_in) {}

  // The first failure wins; later ones are consequences.
  void peer_failed(int peer, const boost::system::error_code& ec, const char* doing) {
    if (!failure.ok()) return;
    namespace error = boost::asio::error;
    const bool closed = ec == error::eof || ec == error::connection_reset || ec == error::broken_pipe;
    failure = link_failure(peer, mesh.address(peer), closed, doing, ec.message());
    suspects.insert(peer);
  }
  void mismatch(const Recv& r) {
    if (!failure.ok()) return;
    failure = Status::InvalidArgument(
        "mismatched collective calls: rank " + std::to_string(r.peer) + " called " +
        (r.got.magic == kMagic ? describe_call(r.got) : std::string("something unreadable")) + ", rank " +
        std::to_string(mesh.rank) + " called " + describe_call(r.expected) +
        "; every rank must call the same operations in the same order with the same dtypes and shapes");
  }
  // Piece k of `r` arrived whole: a send that waited for it may go now.
  void piece_arrived(Recv& r, size_t k) {
    r.absorbed[k] = 1;
    if (on_piece_arrived) on_piece_arrived();
  }

  Mesh& mesh;
  std::vector<Send>& sends;
  std::vector<Recv>& recvs;
  int pending = 0;  // transfers (or their TCP streams) not finished
  Status failure;
  std::set<int> suspects;
  std::function<void()> on_piece_arrived;
};

}  // namespace capstan::collectives

#endif  // CAPSTAN_LIB_COLLECTIVES_EXCHANGE_H_
