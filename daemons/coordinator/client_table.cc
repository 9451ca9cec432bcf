#include "daemons/coordinator/client_table.h"

namespace capstan::coordinator {

void ClientTable::seen(uint64_t client, kj::TimePoint now) {
  if (client != 0 && grace_.count() > 0) last_heard_.insert_or_assign(client, now);
}

std::optional<int64_t> ClientTable::find(uint64_t client, int64_t seq) const {
  if (client == 0) return std::nullopt;
  auto requests = requests_.find(client);
  if (requests == requests_.end()) return std::nullopt;
  auto found = requests->second.find(seq);
  if (found == requests->second.end()) return std::nullopt;
  return found->second;
}

void ClientTable::remember(uint64_t client, int64_t seq, int64_t id) {
  if (client == 0) return;
  auto& seen = requests_[client];
  seen[seq] = id;
  if (seen.size() > kRememberedRequests) seen.erase(seen.begin());
}

std::vector<uint64_t> ClientTable::expire(kj::TimePoint now) {
  std::vector<uint64_t> gone;
  const kj::Duration grace = grace_.count() * kj::MILLISECONDS;
  for (auto it = last_heard_.begin(); it != last_heard_.end();) {
    if (now - it->second < grace) {
      ++it;
      continue;
    }
    gone.push_back(it->first);
    requests_.erase(it->first);
    it = last_heard_.erase(it);
  }
  return gone;
}

}  // namespace capstan::coordinator
