#include "collectives/tcp_transport.h"

#include <algorithm>

namespace capstan::collectives {

namespace asio = boost::asio;

void TcpTransfers::add_send(size_t index) {
  for (int stream = 0; stream < streams_; ++stream) {
    if (stream > 0 && static_cast<size_t>(stream) >= state_.sends[index].pieces.size()) break;
    ++state_.pending;
    sends_.push_back({index, stream, static_cast<size_t>(stream), stream == 0});
  }
}

void TcpTransfers::pump() {
  for (size_t t = 0; t < sends_.size(); ++t) {
    StreamSend& ts = sends_[t];
    if (ts.busy || ts.done || !state_.failure.ok()) continue;
    Send& s = state_.sends[ts.index];
    std::vector<asio::const_buffer> buffers;
    if (ts.header) buffers.push_back(asio::buffer(&s.header, sizeof(Header)));
    size_t k = ts.next;
    while (k < s.pieces.size() && (!s.ready || s.ready(k)) && buffers.size() < 32) {
      buffers.push_back(asio::buffer(s.pieces[k].data, s.pieces[k].bytes));
      k += static_cast<size_t>(streams_);
    }
    if (buffers.empty()) {
      if (ts.next >= s.pieces.size()) {
        ts.done = true;
        --state_.pending;
      }
      continue;  // waits for its next piece to be ready
    }
    ts.busy = true;
    ts.header = false;
    ts.next = k;
    asio::async_write(*state_.mesh.peers[static_cast<size_t>(s.peer)].data[static_cast<size_t>(ts.stream)], buffers,
                      [this, t](boost::system::error_code ec, size_t) {
                        sends_[t].busy = false;
                        if (ec) {
                          sends_[t].done = true;
                          --state_.pending;
                          return state_.peer_failed(state_.sends[sends_[t].index].peer, ec, "receiving from this rank");
                        }
                        pump();
                      });
  }
}

// The header on stream 0, then each stream reads its pieces in order into
// their places.
void TcpTransfers::add_recv(size_t i) {
  ++state_.pending;  // the header, then one per stream that carries a piece
  Recv& r = state_.recvs[i];
  asio::async_read(*state_.mesh.peers[static_cast<size_t>(r.peer)].data[0], asio::buffer(&r.got, sizeof(Header)),
                   [this, i](boost::system::error_code ec, size_t) { header_read(i, ec); });
}

void TcpTransfers::header_read(size_t i, const boost::system::error_code& ec) {
  Recv& r = state_.recvs[i];
  if (ec) {
    --state_.pending;
    return state_.peer_failed(r.peer, ec, "sending to this rank");
  }
  if (!same_call(r.got, r.expected)) {
    --state_.pending;
    return state_.mismatch(r);
  }
  const int used = static_cast<int>(std::min<size_t>(static_cast<size_t>(streams_), r.pieces.size()));
  --state_.pending;
  if (used == 0) {
    r.done = true;
    return;
  }
  state_.pending += used;
  streams_left_[i] = used;
  for (int stream = 0; stream < used; ++stream) read_piece(i, static_cast<size_t>(stream));
}

void TcpTransfers::read_piece(size_t i, size_t k) {
  Recv& r = state_.recvs[i];
  const int stream = static_cast<int>(k % static_cast<size_t>(streams_));
  if (k >= r.pieces.size()) {
    --state_.pending;
    if (--streams_left_[i] == 0) r.done = true;
    return;
  }
  asio::async_read(*state_.mesh.peers[static_cast<size_t>(r.peer)].data[static_cast<size_t>(stream)],
                   asio::buffer(r.pieces[k].data, r.pieces[k].bytes),
                   [this, i, k](boost::system::error_code ec, size_t) {
                     Recv& got = state_.recvs[i];
                     if (ec) {
                       --state_.pending;
                       return state_.peer_failed(got.peer, ec, "sending to this rank");
                     }
                     if (got.absorb) got.absorb(k, got.pieces[k].data, 0, got.pieces[k].bytes);
                     state_.piece_arrived(got, k);
                     read_piece(i, k + static_cast<size_t>(streams_));
                   });
}

}  // namespace capstan::collectives
