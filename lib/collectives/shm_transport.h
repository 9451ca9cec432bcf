// The shared-memory half of an exchange over the mesh: each send and
// receive with a peer that has a ShmLink. A send is a record [header block]
// [each piece, padded to 64 bytes] copied into the outgoing ring as room
// frees up and pieces become ready; a receive reads it back, handing each
// part to the receive's absorb straight out of the ring where it has one.
// Nothing happens in the background: progress() moves what it can and the
// exchange's loop calls it until done. Not thread-safe: the exchange's
// thread only.
#ifndef CAPSTAN_LIB_COLLECTIVES_SHM_TRANSPORT_H_
#define CAPSTAN_LIB_COLLECTIVES_SHM_TRANSPORT_H_

#include <cstddef>
#include <vector>

#include "collectives/exchange.h"
#include "collectives/failure.h"

namespace capstan::collectives {

class ShmTransfers {
 public:
  // At most `chunk` bytes of a piece go into the ring at a time (then it is
  // published, so the receiver starts early). `state` must outlive this.
  ShmTransfers(ExchangeState& state, size_t chunk) : state_(state), chunk_(chunk) {}

  // sends[index] / recvs[index] go over shared memory (counted in
  // state.pending).
  void add_send(size_t index);
  void add_recv(size_t index);
  bool empty() const { return sends_.empty() && recvs_.empty(); }
  // Copies in and out what the rings and the pieces' readiness allow; true
  // if anything moved.
  bool progress();
  // Transfers not finished.
  size_t open() const;
  // Fails the exchange for a peer whose process is gone (its control
  // connection closed) once nothing more of it can come.
  void peers_gone(const GroupFailure& failure);
  // The links the unfinished transfers wait on, each once.
  std::vector<ShmLink*> blocked_links() const;

 private:
  struct SendState {
    size_t index;  // into sends
    bool header_written = false;
    size_t piece = 0;   // the one being written
    size_t offset = 0;  // of it
    bool done = false;
  };
  struct RecvState {
    size_t index;  // into recvs
    bool header_read = false;
    size_t piece = 0;
    size_t offset = 0;
    size_t padding_read = 0;
    bool done = false;
  };

  bool write(SendState& st);
  bool read(RecvState& st);
  ShmLink& link(int peer) const { return *state_.mesh.peers[static_cast<size_t>(peer)].shm; }

  ExchangeState& state_;
  const size_t chunk_;
  std::vector<SendState> sends_;
  std::vector<RecvState> recvs_;
};

}  // namespace capstan::collectives

#endif  // CAPSTAN_LIB_COLLECTIVES_SHM_TRANSPORT_H_
