// The Transport (transport.h) over the group's mesh (mesh.h): each
// exchange's transfers go over shared memory where the pair has a ShmLink
// (shm_transport.h), TCP otherwise (tcp_transport.h), both driven by one
// loop on this thread: Asio handlers for the sockets, polling (spinning
// briefly, then sleeping on the links' doorbells) for shared memory. A
// failure fails the group through GroupFailure (failure.h), which names the
// dead or stuck ranks.
//
// Thread-compatible: one exchange at a time (the communicator's thread).
#ifndef CAPSTAN_LIB_COLLECTIVES_MESH_TRANSPORT_H_
#define CAPSTAN_LIB_COLLECTIVES_MESH_TRANSPORT_H_

#include <vector>

#include "collectives/failure.h"
#include "collectives/mesh.h"
#include "collectives/transport.h"

namespace capstan::collectives {

struct ExchangeState;
class ShmTransfers;

class MeshTransport : public Transport {
 public:
  // `mesh` (formed) and `failure` must outlive this.
  MeshTransport(Mesh& mesh, GroupFailure& failure, const CollectiveOptions& options)
      : mesh_(mesh), failure_(failure), options_(options) {}

  int rank() const override { return mesh_.rank; }
  int size() const override { return mesh_.size; }
  [[nodiscard]] Status exchange(std::vector<Send>& sends, std::vector<Recv>& recvs,
                                Clock::time_point deadline) override;
  // Shared memory hands out its ring; TCP reads a piece per stream at once.
  int landing_slots(int peer) const override { return mesh_.on_shm(peer) ? 0 : mesh_.streams; }
  [[nodiscard]] Status usable() const override { return failure_.usable(); }
  [[nodiscard]] Status fail(const Status& reason) override { return failure_.fail(reason, {}); }

 private:
  void sleep_on_links(ShmTransfers& shm, std::chrono::microseconds sleep, Clock::duration left);
  [[nodiscard]] Status give_up(ExchangeState& state);

  Mesh& mesh_;
  GroupFailure& failure_;
  const CollectiveOptions options_;
};

}  // namespace capstan::collectives

#endif  // CAPSTAN_LIB_COLLECTIVES_MESH_TRANSPORT_H_
