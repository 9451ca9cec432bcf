// Spans: what a process was doing, kept two ways.
//
//   flight recorder  always on: the last K spans (closures, steps,
//                    collectives, RPCs, ...) with their state (started,
//                    finished, failed) and detail, in a ring. `capstanctl
//                    dump` prints every daemon's; a collective whose
//                    deadline passes logs its group's.
//   trace            on only while asked for (`capstanctl trace --seconds
//                    N`, Recorder::start_trace): every span that ends is
//                    kept, up to a bound, for a Chrome trace of the
//                    cluster (capstan/cluster_trace.h).
//
//   {
//     capstan::trace::Span span(capstan::trace::Kind::kStep, "train_step");
//     span.set_detail("step 17");
//     ...
//     if (!status.ok()) span.fail(status.to_string());
//   }  // finished here
//
// Capstan marks its own work: a worker's closures and steps (and their
// phases, capstan/phases.h), every RPC a daemon serves, the host
// collectives (with their sequence numbers), the program's schedule()
// calls, data-service reads and checkpoint phases.
//
// Cost: a span is a mutex-guarded write into the ring when it starts and
// when it ends (~100 ns), plus, while a trace records, one event appended.
// With no trace recording, a phase costs nothing more than before.
//
// Thread-safety: Recorder is thread-safe; a Span belongs to one thread
// unless made `async` (then it may end on another).
#ifndef CAPSTAN_TRACE_H_
#define CAPSTAN_TRACE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "capstan/export.h"
#include "capstan/status.h"

namespace capstan CAPSTAN_API {
namespace trace {

enum class Kind : uint8_t {
  kClosure = 0,     // a closure run on a worker
  kStep = 1,        // a synchronous step run on a worker
  kPhase = 2,       // a phase of a closure or step (input, ps, all-reduce)
  kRpc = 3,         // an RPC a daemon serves
  kCollective = 4,  // a collective operation of a group
  kRead = 5,        // a data-service read
  kCheckpoint = 6,  // a phase of saving or restoring a checkpoint
  kSchedule = 7,    // a program's schedule() of a closure
  kUser = 8,        // marked by the user's code
};
// "closure", "step", "phase", "rpc", "collective", "read", "checkpoint",
// "schedule", "user".
const char* kind_name(Kind kind);

enum class State : uint8_t { kStarted = 0, kFinished = 1, kFailed = 2 };
const char* state_name(State state);  // "started", "finished", "failed"

// Nanoseconds on this process's trace clock (steady: never steps back).
int64_t now_ns();

// One span that ended while a trace recorded.
struct Event {
  Kind kind = Kind::kUser;
  bool async = false;   // may overlap others on its thread (an RPC)
  bool failed = false;
  uint32_t thread = 0;  // TraceCapture::threads
  uint64_t id = 0;      // unique in the process
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  uint64_t flow_in = 0;   // a flow that ends here (a closure's id on the worker)
  uint64_t flow_out = 0;  // a flow that starts here (the id it was scheduled as)
  uint64_t flow_key = 0;  // Recorder::bind_flow's key; stop_trace makes it flow_out
  std::string name;
  std::string detail;
};

// One span as the flight recorder holds it.
struct FlightRecord {
  uint64_t id = 0;
  Kind kind = Kind::kUser;
  State state = State::kStarted;
  uint32_t thread = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;  // 0 while started
  std::string name;
  std::string detail;  // what it is; for a failed span, why as well
};

struct TraceThread {
  uint32_t index = 0;
  std::string name;  // the OS thread's name
};

struct TraceCapture {
  std::vector<Event> events;
  std::vector<TraceThread> threads;
  uint64_t dropped = 0;  // events past max_events, not kept
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

class Recorder {
 public:
  static constexpr size_t kDefaultFlightCapacity = 4096;
  static constexpr size_t kMaxTraceEvents = 500000;

  // The process's recorder (one, shared with the modules it loads).
  static Recorder& get();

  // Keeps the last `capacity` spans (at least 16); drops what it held.
  void set_flight_capacity(size_t capacity);
  size_t flight_capacity() const;

  // Starts keeping every span that ends, up to `max_events` (1 to
  // kMaxTraceEvents). FailedPrecondition while a trace already records.
  Status start_trace(size_t max_events);
  // Stops the trace and returns what it kept (empty when none recorded).
  TraceCapture stop_trace();
  bool tracing() const { return tracing_.load(std::memory_order_relaxed); }

  // The flight records, oldest first.
  std::vector<FlightRecord> flight() const;

  // A flow that starts at a span whose id comes later (a closure's id
  // arrives with the coordinator's answer): the span takes flow key
  // `key` (new_flow_key(), while tracing), and bind_flow(key, id) names
  // the id. Kept only while a trace records.
  uint64_t new_flow_key();
  void bind_flow(uint64_t key, uint64_t flow_id);

  // Span's side (use Span): the flight record's start and end; end()
  // keeps `event` too while a trace records (moved from; `detail` may be
  // its own).
  uint64_t begin(Kind kind, const std::string& name, const std::string& detail, int64_t start_ns, uint32_t thread);
  void end(uint64_t id, bool failed, const std::string& detail, int64_t end_ns, Event* event);
  // Keeps `event` while a trace records (record_finished).
  void append(Event&& event);
  // thread_index()'s side: the index of a new thread named `name`.
  uint32_t add_thread(std::string name);

  struct Impl;

 private:
  Recorder();
  std::atomic<bool> tracing_{false};
  Impl* impl_;  // never freed: spans may end during static destruction
};

// The calling thread's index in traces (its name recorded once).
uint32_t thread_index();

// A span of work: started when made, finished when destroyed (or by
// finish()), failed by fail(). Movable.
class Span {
 public:
  Span(Kind kind, std::string name, std::string detail = {});
  ~Span() { finish(); }
  Span(Span&& other) noexcept;
  Span& operator=(Span&&) = delete;
  Span(const Span&) = delete;

  // May overlap other spans of its thread and end on another (an RPC the
  // loop serves while it serves others).
  void set_async() { event_.async = true; }
  void set_detail(std::string detail);
  const std::string& detail() const { return event_.detail; }
  void set_flow_in(uint64_t id) { event_.flow_in = id; }
  void set_flow_out(uint64_t id) { event_.flow_out = id; }
  // A flow whose id comes later (Recorder::bind_flow).
  void set_flow_key(uint64_t key) { event_.flow_key = key; }
  void fail(std::string_view why);
  void finish();

 private:
  Event event_;
  bool open_ = true;
};

// The records as lines, one each, times relative to `now_ns` (the clock
// of the process that recorded them):
//   "  12.301 s ago  collective all_reduce  finished in 1.20 ms  generation 3, rank 0 of 3, seq 41, 4096 bytes"
//   "   0.000 s ago  rpc Worker.runClosure  started, running for 30.1 s"
std::string format_records(const std::vector<FlightRecord>& records, int64_t now_ns);

// Where a failure's flight records are reported (a daemon sets its log;
// by default standard error). Thread-safe.
void set_report_sink(std::function<void(const std::string&)> sink);
void report(const std::string& text);

// Records a span that has already ended (a phase, timed elsewhere): kept
// only while a trace records; not in the flight recorder.
void record_finished(Kind kind, const char* name, int64_t start_ns, int64_t end_ns);

}  // namespace trace
}  // namespace capstan

#endif  // CAPSTAN_TRACE_H_
