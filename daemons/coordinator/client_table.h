// ClientTable: the programs' clients as the coordinator knows them, by the
// client id their schedule and release calls carry. Two things per client:
//   requests   the closure each schedule request (its sequence number)
//              scheduled, so that a retry after a broken link answers the
//              same closure instead of queueing another (the last
//              kRememberedRequests of each client);
//   last heard when the client last called: one silent for `grace` is
//              gone (its program ended or died), and expire() hands it back
//              so the coordinator releases its values.
// Client 0 names nobody: nothing is kept for it.
//
// Example:
//   ClientTable clients(std::chrono::minutes(5));
//   clients.seen(7, now);
//   if (auto id = clients.find(7, seq)) return *id;  // a retry
//   clients.remember(7, seq, scheduled_id);
//   for (uint64_t gone : clients.expire(later)) release_values_of(gone);
//
// Not thread-safe: the Coordinator uses it on its loop thread.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_CLIENT_TABLE_H_
#define CAPSTAN_DAEMONS_COORDINATOR_CLIENT_TABLE_H_

#include <kj/time.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace capstan::coordinator {

class ClientTable {
 public:
  // grace 0: clients never expire (and are not tracked).
  explicit ClientTable(std::chrono::milliseconds grace) : grace_(grace) {}

  // `client` made a call at `now`.
  void seen(uint64_t client, kj::TimePoint now);
  // The closure request `seq` of `client` scheduled, when it is remembered.
  std::optional<int64_t> find(uint64_t client, int64_t seq) const;
  // Request `seq` of `client` scheduled closure `id`; past
  // kRememberedRequests for the client, its lowest request is forgotten.
  void remember(uint64_t client, int64_t seq, int64_t id);
  // The clients not heard from for `grace` at `now`, in id order; they and
  // their requests are forgotten.
  std::vector<uint64_t> expire(kj::TimePoint now);
  // Clients heard from within the grace (as of the last expire()).
  size_t size() const { return last_heard_.size(); }

  static constexpr size_t kRememberedRequests = 1 << 16;

 private:
  const std::chrono::milliseconds grace_;
  std::map<uint64_t, std::map<int64_t, int64_t>> requests_;  // client -> request seq -> closure id
  std::map<uint64_t, kj::TimePoint> last_heard_;
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_CLIENT_TABLE_H_
