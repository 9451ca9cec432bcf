// The TCP half of an exchange over the mesh: each send and receive with a
// peer that has no shared memory, striped over the pair's `streams` data
// connections (piece k on stream k % streams; the header on stream 0). Every
// transfer is an Asio operation on mesh.io; the exchange's loop runs them.
// Not thread-safe: the exchange's thread only.
#ifndef CAPSTAN_LIB_COLLECTIVES_TCP_TRANSPORT_H_
#define CAPSTAN_LIB_COLLECTIVES_TCP_TRANSPORT_H_

#include <cstddef>
#include <vector>

#include "collectives/exchange.h"

namespace capstan::collectives {

class TcpTransfers {
 public:
  // `state` must outlive this.
  explicit TcpTransfers(ExchangeState& state)
      : state_(state), streams_(state.mesh.streams), streams_left_(state.recvs.size(), 0) {}

  // sends[index] / recvs[index] go over TCP (counted in state.pending).
  void add_send(size_t index);
  void add_recv(size_t index);
  // Writes what is ready: each stream writes its pieces in order, as many
  // at once as are ready. Called again whenever a piece arrives.
  void pump();

 private:
  // A stream's share of a send: pieces stream, stream + streams, ...
  struct StreamSend {
    size_t index;  // into sends
    int stream;
    size_t next;   // the next piece to write
    bool header;   // stream 0 writes the header first
    bool busy = false;
    bool done = false;
  };

  void header_read(size_t i, const boost::system::error_code& ec);
  void read_piece(size_t i, size_t k);

  ExchangeState& state_;
  const int streams_;
  std::vector<StreamSend> sends_;
  std::vector<int> streams_left_;  // by receive: its streams still reading
};

}  // namespace capstan::collectives

#endif  // CAPSTAN_LIB_COLLECTIVES_TCP_TRANSPORT_H_
