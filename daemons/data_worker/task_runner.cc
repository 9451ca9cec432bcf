#include "daemons/data_worker/task_runner.h"
#include "sync/mutex.h"

#include <algorithm>

namespace capstan::data_worker {

TaskRunner::TaskRunner(std::unique_ptr<data::Iterator> iterator, Options options)
    : options_(options), iterator_(std::move(iterator)) {
  if (options_.num_consumers <= 0 && !options_.cross_trainer_cache) {
    producer_ = std::thread([this]() { produce(); });
  }
}

TaskRunner::~TaskRunner() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (producer_.joinable()) producer_.join();
  // Wait for a request thread still pulling from the pipeline.
  MutexLock lock(mutex_);
  while (pulling_) cv_.wait(mutex_);
}

int64_t TaskRunner::produced() const {
  MutexLock lock(mutex_);
  return produced_;
}

void TaskRunner::produce() {
  MutexLock lock(mutex_);
  while (true) {
    while (!stopping_ && (static_cast<int64_t>(buffer_.size()) >= options_.buffer_elements ||
                          buffer_bytes_ >= options_.buffer_bytes)) {
      cv_.wait(mutex_);
    }
    if (stopping_) return;
    pulling_ = true;
    mutex_.unlock();
    Item item;
    auto next = iterator_->get_next();
    mutex_.lock();
    pulling_ = false;
    if (!next.ok()) {
      item.status = next.status();
    } else if (!next->has_value()) {
      end_ = true;
      cv_.notify_all();
      return;
    } else {
      ++produced_;
      if (skip_ > 0) {  // the consumer has it from before the restart
        --skip_;
        continue;
      }
      item.element = std::move(**next);
      buffer_bytes_ += static_cast<int64_t>(item.element.byte_size());
    }
    if (skip_ > 0) continue;  // an error the consumer already saw
    buffer_.push_back(std::move(item));
    cv_.notify_all();
  }
}

Result<bool> TaskRunner::pull_locked(Element* out) {
  while (pulling_ && !stopping_) cv_.wait(mutex_);
  if (stopping_) return Status::Cancelled("the task is being removed");
  if (end_) return false;
  pulling_ = true;
  mutex_.unlock();
  auto next = iterator_->get_next();
  mutex_.lock();
  pulling_ = false;
  cv_.notify_all();
  if (!next.ok()) return next.status();
  if (!next->has_value()) {
    end_ = true;
    return false;
  }
  *out = std::move(**next);
  ++produced_;
  return true;
}

Result<TaskRunner::Reply> TaskRunner::get(const Request& request) {
  if (request.max_elements <= 0) {
    return Status::InvalidArgument("max_elements must be positive, got " + std::to_string(request.max_elements));
  }
  MutexLock lock(mutex_);
  if (options_.num_consumers > 0) return get_round(request);
  if (options_.cross_trainer_cache) return get_cached(request);
  return get_first_come(request);
}

void TaskRunner::skip_buffered() {
  while (skip_ > 0 && !buffer_.empty()) {
    Item& front = buffer_.front();
    if (front.status.ok()) {
      buffer_bytes_ -= static_cast<int64_t>(front.element.byte_size());
      --skip_;
    }
    buffer_.pop_front();
  }
  cv_.notify_all();
}

Result<TaskRunner::Reply> TaskRunner::get_first_come(const Request& request) {
  if (request.sequence <= 0) {
    asked_ = true;
    return take_first_come(request);
  }
  if (request.client_id < 0 || request.received < 0) {
    return Status::InvalidArgument("a numbered request needs a client id and a received count that are not "
                                   "negative, got client " + std::to_string(request.client_id) + ", received " +
                                   std::to_string(request.received));
  }
  const int64_t acknowledged = request.acknowledged >= 0 ? request.acknowledged : request.sequence - 1;
  if (acknowledged >= request.sequence) {
    return Status::InvalidArgument("request number " + std::to_string(request.sequence) +
                                   " acknowledges its own reply or a later one (acknowledged " +
                                   std::to_string(acknowledged) + ")");
  }
  if (request.sequence - acknowledged > kMaxRequestsInFlight) {
    return Status::InvalidArgument("request number " + std::to_string(request.sequence) + " is more than " +
                                   std::to_string(kMaxRequestsInFlight) + " after the acknowledged number " +
                                   std::to_string(acknowledged) + ": keep at most " +
                                   std::to_string(kMaxRequestsInFlight) + " requests in flight per task");
  }
  auto client = clients_.find(request.client_id);
  if (client != clients_.end()) {
    ClientReplies& c = client->second;
    c.kept.erase(c.kept.begin(), c.kept.upper_bound(acknowledged));  // the client has them
    if (request.sequence <= c.last_served) {
      auto kept = c.kept.find(request.sequence);
      if (kept != c.kept.end()) return kept->second;  // the reply was lost: again
      return Status::FailedPrecondition("client " + std::to_string(request.client_id) + " asked again for request number " +
                                        std::to_string(request.sequence) + ", whose reply it acknowledged (the last "
                                        "served is number " + std::to_string(c.last_served) + ")");
    }
    if (request.sequence != c.last_served + 1) {
      return Status::FailedPrecondition("client " + std::to_string(request.client_id) + " sent request number " +
                                        std::to_string(request.sequence) + " after number " +
                                        std::to_string(c.last_served) + ": expected a kept one or the next");
    }
  } else if (!asked_) {
    // The first request this runner sees may continue a read that began
    // before the worker restarted: the rebuilt pipeline produces the same
    // elements again, and the consumer has some of them.
    resuming_client_ = request.client_id;
    resume_from_ = request.sequence;
  }
  asked_ = true;
  if (request.client_id == resuming_client_ && acknowledged + 1 >= resume_from_) {
    // Every reply before this runner's first one to the client is
    // acknowledged, so `received` counts exactly the elements it got from
    // the runner before the restart (the replies since, this runner's, were
    // empty). A request sent while an earlier one was in flight carries a
    // count that may miss that earlier reply's elements, which the old
    // runner may have delivered: such a count is not trusted.
    skip_ = std::max<int64_t>(0, request.received - handed_out_);
    resuming_client_ = -1;
    skip_buffered();
  }
  Reply reply;
  if (request.client_id != resuming_client_) {
    CAPSTAN_ASSIGN_OR_RETURN(reply, take_first_come(request));
  }  // else "none ready" until the client's count can be trusted
  if (reply.end_of_sequence && client != clients_.end()) {
    // The end goes to a client only once it has every element: while an
    // earlier reply with elements is unacknowledged, "none ready" instead.
    // (The task's end is final for the dispatcher: a client restored from
    // a checkpoint taken before it consumed that reply could not get those
    // elements back from a rebuilt task.)
    for (const auto& [number, kept] : client->second.kept) {
      if (number < request.sequence && (!kept.elements.empty() || !kept.pipeline_error.ok())) {
        reply.end_of_sequence = false;
        break;
      }
    }
  }
  if (client == clients_.end()) {
    if (clients_.size() >= kMaxAcknowledgedClients) {
      clients_.erase(client_order_.front());
      client_order_.pop_front();
    }
    client_order_.push_back(request.client_id);
    client = clients_.emplace(request.client_id, ClientReplies{}).first;
  }
  // A client this runner has not served may have had the numbers before
  // this one answered without it (empty: the task was still being built),
  // or may still have one on its way: either way those numbers get an empty
  // reply ("none ready"), which takes nothing from the task.
  for (int64_t earlier = std::max(acknowledged + 1, client->second.last_served + 1); earlier < request.sequence;
       ++earlier) {
    client->second.kept[earlier] = Reply{};
  }
  client->second.last_served = request.sequence;
  client->second.kept[request.sequence] = reply;  // tensors share their buffers: a cheap copy
  return reply;
}

Result<TaskRunner::Reply> TaskRunner::take_first_come(const Request& request) {
  auto deadline = std::chrono::steady_clock::now() + request.wait;
  while ((buffer_.empty() || skip_ > 0) && !end_ && !stopping_ && cv_.wait_until(mutex_, deadline)) {
    skip_buffered();
  }
  skip_buffered();
  Reply reply;
  int64_t bytes = 0;
  while (!buffer_.empty() && static_cast<int>(reply.elements.size()) < request.max_elements) {
    Item& front = buffer_.front();
    if (!front.status.ok()) {
      if (!reply.elements.empty()) break;  // deliver the elements before the error
      reply.pipeline_error = front.status;
      buffer_.pop_front();
      cv_.notify_all();
      return reply;
    }
    int64_t size = static_cast<int64_t>(front.element.byte_size());
    if (!reply.elements.empty() && bytes + size > request.max_bytes) break;
    bytes += size;
    buffer_bytes_ -= size;
    reply.elements.push_back(std::move(front.element));
    buffer_.pop_front();
    ++handed_out_;
  }
  reply.end_of_sequence = reply.elements.empty() && buffer_.empty() && end_;
  cv_.notify_all();
  return reply;
}

Result<TaskRunner::Reply> TaskRunner::get_round(const Request& request) {
  if (request.consumer_index < 0 || request.consumer_index >= options_.num_consumers) {
    return Status::InvalidArgument("consumer_index " + std::to_string(request.consumer_index) + " is not in [0, " +
                                   std::to_string(options_.num_consumers) + ")");
  }
  if (request.round < 0) return Status::InvalidArgument("round " + std::to_string(request.round) + " is negative");
  auto it = rounds_.find(request.round);
  if (it == rounds_.end()) {
    // The first consumer to ask for a round fills it with the next
    // num_consumers consecutive elements.
    Round round;
    round.taken.assign(static_cast<size_t>(options_.num_consumers), false);
    for (int64_t c = 0; c < options_.num_consumers; ++c) {
      Element e;
      auto pulled = pull_locked(&e);
      if (!pulled.ok()) {
        if (stopping_) return pulled.status();
        Reply reply;
        reply.pipeline_error = pulled.status();
        return reply;
      }
      bool more = *pulled;
      if (!more) {
        Reply reply;
        reply.end_of_sequence = true;
        return reply;
      }
      round.elements.push_back(std::move(e));
    }
    round.remaining = options_.num_consumers;
    it = rounds_.find(request.round);  // another consumer may have filled it meanwhile
    if (it == rounds_.end()) it = rounds_.emplace(request.round, std::move(round)).first;
  }
  Round& round = it->second;
  size_t c = static_cast<size_t>(request.consumer_index);
  if (round.taken[c]) {
    return Status::FailedPrecondition("consumer " + std::to_string(c) + " already read round " +
                                      std::to_string(request.round));
  }
  round.taken[c] = true;
  Reply reply;
  reply.elements.push_back(std::move(round.elements[c]));
  if (--round.remaining == 0) rounds_.erase(it);
  return reply;
}

Result<TaskRunner::Reply> TaskRunner::get_cached(const Request& request) {
  if (request.trainer_id.empty()) {
    return Status::InvalidArgument("the cross-trainer cache needs a trainer_id");
  }
  int64_t& position = trainer_positions_[request.trainer_id];
  if (position < window_start_) position = window_start_;  // fell behind: jump to the window
  Reply reply;
  int64_t bytes = 0;
  while (static_cast<int>(reply.elements.size()) < request.max_elements) {
    int64_t window_end = window_start_ + static_cast<int64_t>(window_.size());
    if (position < window_start_) position = window_start_;
    if (position >= window_end) {
      // This trainer is the furthest ahead: produce the next element.
      Element e;
      auto more = pull_locked(&e);
      if (!more.ok()) {
        if (stopping_) return more.status();
        if (reply.elements.empty()) reply.pipeline_error = more.status();
        break;
      }
      if (!*more) {
        reply.end_of_sequence = reply.elements.empty();
        break;
      }
      int64_t size = static_cast<int64_t>(e.byte_size());
      window_.emplace_back(std::move(e), size);
      window_bytes_ += size;
      while (window_bytes_ > options_.cache_bytes && window_.size() > 1) {
        window_bytes_ -= window_.front().second;
        window_.pop_front();
        ++window_start_;
      }
      continue;
    }
    const auto& [element, size] = window_[static_cast<size_t>(position - window_start_)];
    if (!reply.elements.empty() && bytes + size > request.max_bytes) break;
    reply.elements.push_back(element);
    bytes += size;
    ++position;
  }
  return reply;
}

}  // namespace capstan::data_worker
