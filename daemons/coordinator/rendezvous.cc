#include "daemons/coordinator/rendezvous.h"

namespace capstan::coordinator {

void GroupRendezvous::drop_abandoned(Forming& forming) {
  for (auto it = forming.members.begin(); it != forming.members.end();) {
    // A caller that went away (its RPC was cancelled) no longer waits.
    it = it->second.fulfiller->isWaiting() ? std::next(it) : forming.members.erase(it);
  }
}

Status GroupRendezvous::check_join(const std::string& name, int size, int rank, const std::string& address,
                                   std::chrono::milliseconds timeout) {
  if (name.empty() || name.size() > kMaxText) {
    return Status::InvalidArgument("group name must have 1 to " + std::to_string(kMaxText) + " characters");
  }
  if (size < 1 || size > kMaxGroupSize) {
    return Status::InvalidArgument("group '" + name + "': size " + std::to_string(size) + " is not in [1, " +
                                   std::to_string(kMaxGroupSize) + "]");
  }
  if (rank < -1 || rank >= size) {
    return Status::InvalidArgument("group '" + name + "': rank " + std::to_string(rank) + " is not in [0, " +
                                   std::to_string(size) + ") (or -1 for any)");
  }
  if (address.empty() || address.size() > kMaxText) {
    return Status::InvalidArgument("group '" + name + "': the member's address must have 1 to " +
                                   std::to_string(kMaxText) + " characters");
  }
  if (timeout.count() <= 0 || timeout > std::chrono::hours(24)) {
    return Status::InvalidArgument("group '" + name + "': timeout " + std::to_string(timeout.count()) +
                                   " ms is not in (0, 24 h]");
  }
  return Status::Ok();
}

Status GroupRendezvous::make_room(const std::string& name) {
  if (forming_.count(name) != 0 || forming_.size() < kMaxFormingGroups) return Status::Ok();
  for (auto it = forming_.begin(); it != forming_.end();) {
    drop_abandoned(it->second);
    it = it->second.members.empty() ? forming_.erase(it) : std::next(it);
  }
  if (forming_.size() >= kMaxFormingGroups) {
    return Status::ResourceExhausted("group '" + name + "': " + std::to_string(kMaxFormingGroups) +
                                     " other groups are forming; wait for them to form or time out");
  }
  return Status::Ok();
}

kj::Promise<Result<GroupMembership>> GroupRendezvous::join(const std::string& name, int size, int rank,
                                                           const std::string& address,
                                                           std::chrono::milliseconds timeout) {
  using R = Result<GroupMembership>;
  if (Status valid = check_join(name, size, rank, address, timeout); !valid.ok()) return R(valid);
  if (Status room = make_room(name); !room.ok()) return R(room);
  Forming& forming = forming_[name];
  drop_abandoned(forming);
  if (forming.members.empty()) forming.size = size;
  if (forming.size != size) {
    return R(Status::InvalidArgument("group '" + name + "' is forming with " + std::to_string(forming.size) +
                                     " ranks; this member asked for " + std::to_string(size)));
  }
  if (rank == -1) {
    rank = 0;
    while (forming.members.count(rank) > 0) ++rank;
  } else if (forming.members.count(rank) > 0) {
    return R(Status::AlreadyExists("group '" + name + "': rank " + std::to_string(rank) + " was already joined from " +
                                   forming.members[rank].address));
  }
  auto paf = kj::newPromiseAndFulfiller<R>();
  forming.members[rank] = Member{address, kj::mv(paf.fulfiller)};
  if (static_cast<int>(forming.members.size()) == size) {
    form(name, forming);
    return kj::mv(paf.promise);
  }
  return paf.promise.exclusiveJoin(expire(name, rank, size, timeout));
}

void GroupRendezvous::form(const std::string& name, Forming& forming) {
  GroupMembership group;
  group.generation = ++generations_[name];
  for (const auto& [r, member] : forming.members) group.addresses.push_back(member.address);
  for (auto& [r, member] : forming.members) {
    GroupMembership mine = group;
    mine.rank = r;
    member.fulfiller->fulfill(Result<GroupMembership>(std::move(mine)));
  }
  forming_.erase(name);
}

kj::Promise<Result<GroupMembership>> GroupRendezvous::expire(std::string name, int rank, int size,
                                                             std::chrono::milliseconds timeout) {
  return timer_.afterDelay(timeout.count() * kj::MILLISECONDS)
      .then([this, name = std::move(name), rank, size, timeout]() -> Result<GroupMembership> {
        std::string missing;
        auto it = forming_.find(name);
        if (it != forming_.end()) {
          it->second.members.erase(rank);
          for (int r = 0; r < size; ++r) {
            if (r != rank && it->second.members.count(r) == 0) {
              missing += (missing.empty() ? "" : ", ") + std::to_string(r);
            }
          }
          if (it->second.members.empty()) forming_.erase(it);
        }
        return Status::Unavailable("group '" + name + "' of " + std::to_string(size) + " ranks did not form within " +
                                   std::to_string(timeout.count()) + " ms: rank(s) " + missing + " never joined");
      });
}

int64_t GroupRendezvous::generation(const std::string& name) const {
  auto it = generations_.find(name);
  return it == generations_.end() ? 0 : it->second;
}

int GroupRendezvous::waiting(const std::string& name) const {
  auto it = forming_.find(name);
  return it == forming_.end() ? 0 : static_cast<int>(it->second.members.size());
}

}  // namespace capstan::coordinator
