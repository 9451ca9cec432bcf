// The coordinator as the rendezvous of collective groups (TF's group and
// instance keys, NCCL's unique id): processes that want to form a group of N
// under a name each say where they listen; once N have, every one of them
// learns all N addresses (in rank order) and the group's generation.
// Forming a group under the same name again (after a failure, with the
// survivors or with a returning process) gets the next generation.
//
// Example (a test's view):
//   GroupRendezvous r(timer);
//   auto a = r.join("dense", 2, 0, "10.0.0.1:5000", 30s);
//   auto b = r.join("dense", 2, 1, "10.0.0.2:5000", 30s);
//   a.wait(ws)->addresses  // {"10.0.0.1:5000", "10.0.0.2:5000"}, generation 1
//
// Not thread-safe: runs on the KJ event loop of `timer`.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_RENDEZVOUS_H_
#define CAPSTAN_DAEMONS_COORDINATOR_RENDEZVOUS_H_

#include <kj/async.h>
#include <kj/timer.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "capstan/status.h"

namespace capstan::coordinator {

struct GroupMembership {
  int64_t generation = 0;
  int rank = 0;
  std::vector<std::string> addresses;  // by rank
};

class GroupRendezvous {
 public:
  static constexpr int kMaxGroupSize = 4096;
  static constexpr size_t kMaxText = 512;
  // Groups forming at once (a bound on what callers can make it hold).
  static constexpr size_t kMaxFormingGroups = 1024;

  explicit GroupRendezvous(kj::Timer& timer) : timer_(timer) {}

  // Joins the next group called `name`, of `size` ranks, as `rank` (-1: the
  // lowest free rank), reachable at `address`. Resolves once all `size` have
  // joined; with Unavailable naming the ranks still missing when `timeout`
  // passes first (this member then leaves the forming group); at once with
  // InvalidArgument for bad arguments or a size that differs from the
  // forming group's, AlreadyExists for a rank taken by a member still
  // waiting, ResourceExhausted when kMaxFormingGroups other groups are
  // forming.
  kj::Promise<Result<GroupMembership>> join(const std::string& name, int size, int rank, const std::string& address,
                                            std::chrono::milliseconds timeout);

  // The generation of the last group formed under `name` (0: none yet).
  int64_t generation(const std::string& name) const;
  // Members waiting in the group forming under `name`.
  int waiting(const std::string& name) const;

 private:
  struct Member {
    std::string address;
    kj::Own<kj::PromiseFulfiller<Result<GroupMembership>>> fulfiller;
  };
  struct Forming {
    int size = 0;
    std::map<int, Member> members;  // by rank
  };

  void drop_abandoned(Forming& forming);
  // join()'s argument checks (InvalidArgument).
  static Status check_join(const std::string& name, int size, int rank, const std::string& address,
                           std::chrono::milliseconds timeout);
  // Room for group `name` among the groups forming: abandoned ones go first;
  // ResourceExhausted when kMaxFormingGroups others still form.
  Status make_room(const std::string& name);
  // Every member of the forming group `name` has joined: each learns the
  // group, and it forms.
  void form(const std::string& name, Forming& forming);
  // When `timeout` passes first: `rank` leaves the forming group, and its
  // join fails naming the ranks still missing.
  kj::Promise<Result<GroupMembership>> expire(std::string name, int rank, int size, std::chrono::milliseconds timeout);

  kj::Timer& timer_;
  std::map<std::string, Forming> forming_;
  std::map<std::string, int64_t> generations_;
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_RENDEZVOUS_H_
