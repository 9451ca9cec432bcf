#include "capstan/cluster_trace.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <future>
#include <iterator>
#include <limits>
#include <set>
#include <unistd.h>

#include "capstan_schemas/coordinator.capnp.h"
#include "capstan_schemas/data_dispatcher.capnp.h"
#include "io/durable_file.h"
#include "rpc/sync_channel.h"
#include "wire_names.h"

namespace capstan {
namespace {

using Json = nlohmann::json;

// A daemon to ask: "worker:2" and its address.
struct Member {
  std::string label;
  std::string address;
};

Result<std::vector<Member>> cluster_members(const std::string& coordinator, const std::vector<std::string>& extra,
                                            const ClientOptions& client) {
  rpc::SyncChannel channel(coordinator, client, "capstan-members");
  CAPSTAN_RETURN_IF_ERROR(channel.connect(wire::Role::COORDINATOR));
  CAPSTAN_ASSIGN_OR_RETURN(
      std::vector<Member> members,
      (channel.call<std::vector<Member>, wire::Coordinator>("members", [](wire::Coordinator::Client c) {
        return c.membersRequest().send().then([](capnp::Response<wire::Coordinator::MembersResults>&& r) {
          std::vector<Member> out;
          for (auto m : r.getMembers()) {
            std::string label(role_name(m.getRole()));
            if (m.getTaskIndex() >= 0) label += ":" + std::to_string(m.getTaskIndex());
            out.push_back({label, m.getAddress().cStr()});
          }
          return out;
        });
      })));
  // The coordinator as the user named it (its own idea of its address may
  // be a wildcard's).
  if (!members.empty()) members[0].address = coordinator;
  for (const auto& address : extra) {
    members.push_back({address, address});
    // A data dispatcher brings its data workers.
    rpc::SyncChannel dispatcher(address, client, "capstan-members");
    if (!dispatcher.connect(wire::Role::DATA_DISPATCHER).ok()) continue;
    auto workers = dispatcher.call<std::vector<std::string>, wire::DataDispatcher>(
        "listWorkers", [](wire::DataDispatcher::Client d) {
          return d.listWorkersRequest().send().then([](capnp::Response<wire::DataDispatcher::ListWorkersResults>&& r) {
            std::vector<std::string> out;
            for (auto w : r.getWorkers()) out.emplace_back(w.getAddress().cStr());
            return out;
          });
        });
    if (!workers.ok()) continue;
    for (const auto& w : *workers) members.push_back({w, w});
  }
  return members;
}

// What one daemon recorded, or why it did not.
struct Recorded {
  Member member;
  Status status;
  NodeInfo info;
  NodeClient::ClockOffset clock;
  trace::TraceCapture capture;
};

Recorded record_one(const Member& member, const ClusterTraceOptions& options) {
  Recorded out{member, Status::Ok(), {}, {}, {}};
  auto client = NodeClient::connect(member.address, options.client);
  if (!client.ok()) {
    out.status = client.status();
    return out;
  }
  auto info = (*client)->info();
  if (!info.ok()) {
    out.status = info.status();
    return out;
  }
  out.info = *info;
  if (member.label == member.address) {
    out.member.label = info->role + (info->task_index >= 0 ? ":" + std::to_string(info->task_index) : "");
  }
  auto clock = (*client)->clock_offset();
  if (!clock.ok()) {
    out.status = clock.status();
    return out;
  }
  out.clock = *clock;
  auto capture = (*client)->trace(options.seconds, options.max_events);
  if (!capture.ok()) {
    out.status = capture.status();
    return out;
  }
  out.capture = std::move(*capture);
  return out;
}

// One process's events in the file: `offset_ns` takes its clock to ours,
// `zero_ns` (ours) is the file's time 0.
void write_process(const Recorded& r, int pid, int64_t zero_ns, const std::set<uint64_t>& flows, Json& events,
                   size_t& written) {
  const int64_t offset = r.clock.offset_ns;
  auto us = [offset, zero_ns](int64_t ns) { return static_cast<double>(ns - offset - zero_ns) * 1e-3; };
  std::string name = r.member.label + " " + r.member.address;
  if (r.info.pid > 0) name += " (pid " + std::to_string(r.info.pid) + ")";
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0}, {"ts", 0}, {"args", {{"name", name}}}});
  events.push_back(
      {{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"tid", 0}, {"ts", 0}, {"args", {{"sort_index", pid}}}});
  std::set<uint32_t> used;
  for (const auto& e : r.capture.events) used.insert(e.thread);
  for (const auto& t : r.capture.threads) {
    if (used.count(t.index) == 0) continue;
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", pid},
                      {"tid", t.index + 1},
                      {"ts", 0},
                      {"args", {{"name", t.name.empty() ? "thread " + std::to_string(t.index) : t.name}}}});
  }
  for (const auto& e : r.capture.events) {
    const int tid = static_cast<int>(e.thread) + 1;
    Json args = Json::object();
    if (!e.detail.empty()) args["detail"] = e.detail;
    if (e.failed) args["failed"] = true;
    if (e.async) {
      char id[40];
      std::snprintf(id, sizeof(id), "0x%x%012llx", pid, static_cast<unsigned long long>(e.id));
      // A process-local id: the viewers draw them under their process.
      const Json id2 = {{"local", id}};
      events.push_back({{"ph", "b"}, {"cat", trace::kind_name(e.kind)}, {"name", e.name}, {"id2", id2},
                        {"pid", pid}, {"tid", tid}, {"ts", us(e.start_ns)}, {"args", args}});
      events.push_back({{"ph", "e"}, {"cat", trace::kind_name(e.kind)}, {"name", e.name}, {"id2", id2},
                        {"pid", pid}, {"tid", tid}, {"ts", us(e.end_ns)}});
      written += 2;
      continue;
    }
    events.push_back({{"ph", "X"}, {"cat", trace::kind_name(e.kind)}, {"name", e.name}, {"pid", pid},
                      {"tid", tid}, {"ts", us(e.start_ns)}, {"dur", static_cast<double>(e.end_ns - e.start_ns) * 1e-3},
                      {"args", args}});
    ++written;
    // A flow binds to the innermost slice open at its point: the start of
    // this one (before its phases begin), or for a schedule (which has
    // none), its middle.
    if (e.flow_out != 0 && flows.count(e.flow_out) > 0) {
      events.push_back({{"ph", "s"}, {"cat", "closure"}, {"name", "closure"}, {"id", e.flow_out}, {"pid", pid},
                        {"tid", tid}, {"ts", us(e.start_ns + (e.end_ns - e.start_ns) / 2)}});
      ++written;
    }
    if (e.flow_in != 0 && flows.count(e.flow_in) > 0) {
      events.push_back({{"ph", "f"}, {"bp", "e"}, {"cat", "closure"}, {"name", "closure"}, {"id", e.flow_in},
                        {"pid", pid}, {"tid", tid}, {"ts", us(e.start_ns)}});
      ++written;
    }
  }
}

}  // namespace

Result<ClusterTrace> record_cluster_trace(const std::string& coordinator, const ClusterTraceOptions& options) {
  if (!(options.seconds > 0 && options.seconds <= 600)) {
    return Status::InvalidArgument("a trace records for more than 0 and at most 600 seconds, not " +
                                   std::to_string(options.seconds));
  }
  if (options.max_events < 1 || options.max_events > trace::Recorder::kMaxTraceEvents) {
    return Status::InvalidArgument("max_events must be 1 to " + std::to_string(trace::Recorder::kMaxTraceEvents) +
                                   ", not " + std::to_string(options.max_events));
  }
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<Member> members,
                           cluster_members(coordinator, options.extra_addresses, options.client));
  trace::Recorder& local = trace::Recorder::get();
  const bool here = options.this_process;
  if (here) CAPSTAN_RETURN_IF_ERROR(local.start_trace(options.max_events));
  std::vector<std::future<Recorded>> pending;
  for (const Member& m : members) {
    pending.push_back(std::async(std::launch::async, [m, &options]() { return record_one(m, options); }));
  }
  std::vector<Recorded> recorded;
  if (here) {
    // Ours ends when the daemons' do (each answers after `seconds`).
    Recorded self{{options.this_process_name, "this process"}, Status::Ok(), {}, {}, {}};
    self.info.pid = ::getpid();
    for (auto& p : pending) p.wait();
    self.capture = local.stop_trace();
    recorded.push_back(std::move(self));
  }
  for (auto& p : pending) recorded.push_back(p.get());

  ClusterTrace out;
  int64_t zero = std::numeric_limits<int64_t>::max();
  std::set<uint64_t> starts, ends;
  for (const Recorded& r : recorded) {
    if (!r.status.ok()) {
      out.errors.push_back(r.member.label + " at " + r.member.address + ": " + r.status.to_string());
      continue;
    }
    // Time 0: the earliest start (a span that ended in the trace may have
    // begun before it; viewers drop negative times).
    zero = std::min(zero, r.capture.start_ns - r.clock.offset_ns);
    for (const auto& e : r.capture.events) {
      zero = std::min(zero, e.start_ns - r.clock.offset_ns);
      if (e.flow_out != 0) starts.insert(e.flow_out);
      if (e.flow_in != 0) ends.insert(e.flow_in);
    }
  }
  if (zero == std::numeric_limits<int64_t>::max()) {
    std::string why;
    for (const auto& e : out.errors) why += (why.empty() ? "" : "; ") + e;
    return Status::Unavailable("no daemon recorded a trace: " + why);
  }
  // Flows with both ends in the trace (a closure scheduled before it began,
  // or still queued when it ended, has one).
  std::set<uint64_t> flows;
  std::set_intersection(starts.begin(), starts.end(), ends.begin(), ends.end(), std::inserter(flows, flows.end()));
  Json events = Json::array();
  Json processes = Json::array();
  int pid = 0;
  for (const Recorded& r : recorded) {
    if (!r.status.ok()) continue;
    ++pid;
    write_process(r, pid, zero, flows, events, out.events);
    out.dropped += r.capture.dropped;
    ++out.processes;
    processes.push_back({{"pid", pid},
                         {"name", r.member.label},
                         {"address", r.member.address},
                         {"os_pid", r.info.pid},
                         {"clock_offset_ns", r.clock.offset_ns},
                         {"clock_round_trip_ns", r.clock.round_trip_ns},
                         {"events", r.capture.events.size()},
                         {"dropped", r.capture.dropped}});
  }
  Json file = {{"displayTimeUnit", "ms"},
               {"traceEvents", std::move(events)},
               {"otherData",
                {{"producer", "capstan"},
                 {"clock", "each process's steady clock shifted by its offset from the recording program's "
                           "(measured over RPC round trips: the offset at the fastest of 5, its error at most "
                           "half that round trip); ts in microseconds from the trace's start"},
                 {"seconds", options.seconds},
                 {"processes", std::move(processes)},
                 {"errors", out.errors}}}};
  out.json = file.dump();
  return out;
}

Status ClusterTrace::write(const std::string& path) const {
  return io::write_file_durably(path, json).with_context("writing the trace to '" + path + "'");
}

Result<ClusterDump> dump_cluster(const std::string& coordinator, const std::vector<std::string>& extra_addresses,
                                 ClientOptions client, std::chrono::milliseconds answer_timeout, size_t last) {
  client.connect_timeout = std::min(client.connect_timeout, answer_timeout);
  client.call_timeout = answer_timeout;
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<Member> members, cluster_members(coordinator, extra_addresses, client));
  struct Answer {
    Status status;
    NodeClient::Flight flight;
  };
  std::vector<std::future<Answer>> pending;
  for (const Member& m : members) {
    pending.push_back(std::async(std::launch::async, [m, client]() {
      auto node = NodeClient::connect(m.address, client);
      if (!node.ok()) return Answer{node.status(), {}};
      auto flight = (*node)->flight();
      if (!flight.ok()) return Answer{flight.status(), {}};
      return Answer{Status::Ok(), std::move(*flight)};
    }));
  }
  ClusterDump out;
  for (size_t i = 0; i < members.size(); ++i) {
    Answer a = pending[i].get();
    const Member& m = members[i];
    if (!a.status.ok()) {
      out.unanswered.push_back(m.label + " (" + m.address + ")");
      out.text += "== " + m.label + " " + m.address + ": NO ANSWER within " + std::to_string(answer_timeout.count()) +
                  " ms (stopped, hung or dead?): " + a.status.to_string() + "\n";
      continue;
    }
    // The last `last`, and every one still running (where it waits).
    const auto& all = a.flight.records;
    std::vector<trace::FlightRecord> shown;
    size_t open = 0;
    for (size_t k = 0; k < all.size(); ++k) {
      const bool running = all[k].state == trace::State::kStarted;
      open += running ? 1 : 0;
      if (running || k + last >= all.size()) shown.push_back(all[k]);
    }
    out.text += "== " + m.label + " " + m.address + ": " + std::to_string(all.size()) + " record(s) kept (at most " +
                std::to_string(a.flight.capacity) + "), " + std::to_string(open) + " still running; " +
                std::to_string(shown.size()) + " shown\n";
    out.text += trace::format_records(shown, a.flight.now_ns);
  }
  return out;
}

}  // namespace capstan
