#include "capstan/trace.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <unordered_map>

#include "sync/mutex.h"

namespace capstan::trace {
namespace {

// A failed span's detail and an RPC's name stay short in the ring.
constexpr size_t kMaxDetailBytes = 512;

// `from`, at most kMaxDetailBytes of it, into `to`, reusing its buffer (a
// flight-record slot's: no allocation once the slot has held as long a text).
void assign_clipped(std::string& to, const std::string& from) {
  if (from.size() <= kMaxDetailBytes) {
    to.assign(from);
    return;
  }
  to.assign(from, 0, kMaxDetailBytes - 3);
  to += "...";
}

}  // namespace

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kClosure: return "closure";
    case Kind::kStep: return "step";
    case Kind::kPhase: return "phase";
    case Kind::kRpc: return "rpc";
    case Kind::kCollective: return "collective";
    case Kind::kRead: return "read";
    case Kind::kCheckpoint: return "checkpoint";
    case Kind::kSchedule: return "schedule";
    case Kind::kUser: return "user";
  }
  return "user";
}

const char* state_name(State state) {
  switch (state) {
    case State::kStarted: return "started";
    case State::kFinished: return "finished";
    case State::kFailed: return "failed";
  }
  return "started";
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Recorder::Impl {
  mutable Mutex mutex;
  std::vector<FlightRecord> ring GUARDED_BY(mutex);  // slot = id % size
  uint64_t next_id GUARDED_BY(mutex) = 1;
  // The trace being recorded. Its events' names and details are kept in
  // `text` (the Event's own strings are emptied as it is kept), so that
  // recording allocates nothing per event: strings kept alive one by one
  // between the traced program's buffers made malloc hand those buffers
  // fresh pages each time (collective_bench's 64-256 KiB all-reduces took 2-4x
  // as long while traced). stop_trace puts the strings back.
  struct TextRef {
    uint32_t name_offset, name_size, detail_offset, detail_size;
  };
  static constexpr size_t kTextPerEvent = 64;  // on average; past it, texts are clipped
  std::vector<Event> events GUARDED_BY(mutex);
  std::vector<TextRef> texts GUARDED_BY(mutex);  // one per event
  std::string text GUARDED_BY(mutex);            // reserved whole
  size_t max_text GUARDED_BY(mutex) = 0;
  // Keeps `event` in the trace (or counts it dropped), its strings in `text`.
  void keep(Event& event) REQUIRES(mutex);
  size_t max_events GUARDED_BY(mutex) = 0;
  uint64_t dropped GUARDED_BY(mutex) = 0;
  int64_t trace_started GUARDED_BY(mutex) = 0;
  std::unordered_map<uint64_t, uint64_t> flows GUARDED_BY(mutex);  // key -> id
  uint64_t next_flow_key GUARDED_BY(mutex) = 1;
  // Threads by index (ever seen in this process).
  std::vector<std::string> thread_names GUARDED_BY(mutex);
};

Recorder::Recorder() : impl_(new Impl) {
  MutexLock lock(impl_->mutex);
  impl_->ring.resize(kDefaultFlightCapacity);
}

Recorder& Recorder::get() {
  static Recorder* recorder = new Recorder;  // never destroyed (see impl_)
  return *recorder;
}

void Recorder::set_flight_capacity(size_t capacity) {
  MutexLock lock(impl_->mutex);
  impl_->ring.assign(std::max<size_t>(capacity, 16), FlightRecord{});
}

size_t Recorder::flight_capacity() const {
  MutexLock lock(impl_->mutex);
  return impl_->ring.size();
}

Status Recorder::start_trace(size_t max_events) {
  if (max_events < 1 || max_events > kMaxTraceEvents) {
    return Status::InvalidArgument("a trace keeps 1 to " + std::to_string(kMaxTraceEvents) + " events, not " +
                                   std::to_string(max_events));
  }
  MutexLock lock(impl_->mutex);
  if (tracing_.load()) {
    return Status::FailedPrecondition("a trace is already being recorded here; ask again when it is done");
  }
  // Reserved whole (address space; pages are touched as events come): a
  // growing vector's copies would cost the traced process while it runs.
  impl_->events.clear();
  impl_->events.reserve(max_events);
  impl_->texts.clear();
  impl_->texts.reserve(max_events);
  impl_->max_text = max_events * Impl::kTextPerEvent;
  impl_->text.clear();
  impl_->text.reserve(impl_->max_text);
  impl_->max_events = max_events;
  impl_->dropped = 0;
  impl_->flows.clear();
  impl_->trace_started = now_ns();
  tracing_.store(true);
  return Status::Ok();
}

TraceCapture Recorder::stop_trace() {
  TraceCapture capture;
  MutexLock lock(impl_->mutex);
  if (!tracing_.load()) return capture;
  tracing_.store(false);
  capture.events = std::move(impl_->events);
  impl_->events = {};
  for (size_t i = 0; i < capture.events.size(); ++i) {
    const Impl::TextRef& t = impl_->texts[i];
    capture.events[i].name.assign(impl_->text, t.name_offset, t.name_size);
    capture.events[i].detail.assign(impl_->text, t.detail_offset, t.detail_size);
  }
  impl_->texts = {};
  impl_->text = std::string();
  capture.dropped = impl_->dropped;
  capture.start_ns = impl_->trace_started;
  capture.end_ns = now_ns();
  for (Event& e : capture.events) {
    if (e.flow_key == 0) continue;
    auto it = impl_->flows.find(e.flow_key);
    if (it != impl_->flows.end()) e.flow_out = it->second;
    e.flow_key = 0;
  }
  impl_->flows.clear();
  for (size_t i = 0; i < impl_->thread_names.size(); ++i) {
    capture.threads.push_back(TraceThread{static_cast<uint32_t>(i), impl_->thread_names[i]});
  }
  return capture;
}

std::vector<FlightRecord> Recorder::flight() const {
  MutexLock lock(impl_->mutex);
  std::vector<FlightRecord> out;
  const uint64_t size = impl_->ring.size();
  const uint64_t first = impl_->next_id > size ? impl_->next_id - size : 1;
  for (uint64_t id = first; id < impl_->next_id; ++id) {
    const FlightRecord& r = impl_->ring[id % size];
    if (r.id == id) out.push_back(r);
  }
  return out;
}

uint64_t Recorder::new_flow_key() {
  MutexLock lock(impl_->mutex);
  return impl_->next_flow_key++;
}

void Recorder::bind_flow(uint64_t key, uint64_t flow_id) {
  if (!tracing()) return;
  MutexLock lock(impl_->mutex);
  if (impl_->flows.size() < impl_->max_events) impl_->flows[key] = flow_id;
}

uint64_t Recorder::begin(Kind kind, const std::string& name, const std::string& detail, int64_t start_ns,
                         uint32_t thread) {
  MutexLock lock(impl_->mutex);
  const uint64_t id = impl_->next_id++;
  FlightRecord& r = impl_->ring[id % impl_->ring.size()];
  r.id = id;
  r.kind = kind;
  r.state = State::kStarted;
  r.thread = thread;
  r.start_ns = start_ns;
  r.end_ns = 0;
  r.name.assign(name);
  assign_clipped(r.detail, detail);
  return id;
}

void Recorder::end(uint64_t id, bool failed, const std::string& detail, int64_t end_ns, Event* event) {
  MutexLock lock(impl_->mutex);
  FlightRecord& r = impl_->ring[id % impl_->ring.size()];
  if (r.id == id) {
    r.state = failed ? State::kFailed : State::kFinished;
    r.end_ns = end_ns;
    if (failed) assign_clipped(r.detail, detail);
  }
  // `detail` may be the event's own: used above, before keep() empties it.
  if (event == nullptr || !tracing_.load()) return;
  impl_->keep(*event);
}

void Recorder::append(Event&& event) {
  MutexLock lock(impl_->mutex);
  if (!tracing_.load()) return;
  impl_->keep(event);
}

void Recorder::Impl::keep(Event& event) {
  if (events.size() >= max_events) {
    ++dropped;
    return;
  }
  auto store = [this](std::string& from, uint32_t* offset, uint32_t* size) REQUIRES(mutex) {
    const size_t n = std::min(from.size(), max_text - text.size());
    *offset = static_cast<uint32_t>(text.size());
    *size = static_cast<uint32_t>(n);
    text.append(from, 0, n);
    std::string().swap(from);  // its buffer goes back now, on this thread
  };
  TextRef ref{};
  store(event.name, &ref.name_offset, &ref.name_size);
  store(event.detail, &ref.detail_offset, &ref.detail_size);
  texts.push_back(ref);
  events.push_back(std::move(event));
}

uint32_t Recorder::add_thread(std::string name) {
  MutexLock lock(impl_->mutex);
  impl_->thread_names.push_back(std::move(name));
  return static_cast<uint32_t>(impl_->thread_names.size() - 1);
}

uint32_t thread_index() {
  thread_local const uint32_t index = [] {
    char name[32] = "";
    pthread_getname_np(pthread_self(), name, sizeof(name));
    return Recorder::get().add_thread(name);
  }();
  return index;
}

Span::Span(Kind kind, std::string name, std::string detail) {
  event_.kind = kind;
  event_.thread = thread_index();
  event_.start_ns = now_ns();
  event_.name = std::move(name);
  event_.detail = std::move(detail);
  event_.id = Recorder::get().begin(kind, event_.name, event_.detail, event_.start_ns, event_.thread);
}

Span::Span(Span&& other) noexcept : event_(std::move(other.event_)), open_(other.open_) { other.open_ = false; }

void Span::set_detail(std::string detail) { event_.detail = std::move(detail); }

void Span::fail(std::string_view why) {
  event_.failed = true;
  if (!why.empty()) event_.detail += (event_.detail.empty() ? "" : ": ") + std::string(why);
}

void Span::finish() {
  if (!open_) return;
  open_ = false;
  event_.end_ns = now_ns();
  Recorder& recorder = Recorder::get();
  recorder.end(event_.id, event_.failed, event_.detail, event_.end_ns, recorder.tracing() ? &event_ : nullptr);
}

std::string format_records(const std::vector<FlightRecord>& records, int64_t now_ns) {
  std::string out;
  for (const FlightRecord& r : records) {
    char head[160];
    std::snprintf(head, sizeof(head), "  %9.3f s ago  %s %s  ", static_cast<double>(now_ns - r.start_ns) * 1e-9,
                  kind_name(r.kind), r.name.c_str());
    out += head;
    char state[96];
    if (r.state == State::kStarted) {
      std::snprintf(state, sizeof(state), "started, running for %.3f s", static_cast<double>(now_ns - r.start_ns) * 1e-9);
    } else {
      std::snprintf(state, sizeof(state), "%s in %.3f ms", state_name(r.state),
                    static_cast<double>(r.end_ns - r.start_ns) * 1e-6);
    }
    out += state;
    if (!r.detail.empty()) out += "  " + r.detail;
    out += "\n";
  }
  return out;
}

namespace {

Mutex sink_mutex;
std::function<void(const std::string&)>& sink() {
  static auto* f = new std::function<void(const std::string&)>;
  return *f;
}

}  // namespace

void set_report_sink(std::function<void(const std::string&)> f) {
  MutexLock lock(sink_mutex);
  sink() = std::move(f);
}

void report(const std::string& text) {
  MutexLock lock(sink_mutex);
  if (sink()) {
    sink()(text);
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
}

void record_finished(Kind kind, const char* name, int64_t start_ns, int64_t end_ns) {
  Recorder& recorder = Recorder::get();
  if (!recorder.tracing()) return;
  Event event;
  event.kind = kind;
  event.thread = thread_index();
  event.start_ns = start_ns;
  event.end_ns = end_ns;
  event.name = name;
  recorder.append(std::move(event));
}

}  // namespace capstan::trace
