#include "daemons/common/node_service.h"

#include <cmath>
#include <string>

#include "async/loop_thread.h"
#include "async/status_exception.h"
#include "capstan/trace.h"
#include "rpc/tensor_codec.h"
#include "rpc/trace_codec.h"

namespace capstan::daemon {

kj::Promise<void> serve_info(const DaemonContext& ctx, InfoContext context) {
  ctx.identity.fill(context.getResults().initInfo());
  return kj::READY_NOW;
}

kj::Promise<void> serve_echo(const DaemonContext& ctx, EchoContext context) {
  return rpc::read_element(context.getParams().getElement())
      .then([&ctx, context](Element&& element) mutable {
        context.releaseParams();
        rpc::write_element(context.getResults().initElement(), element, ctx.codec);
      });
}

kj::Promise<void> serve_discard(const DaemonContext& ctx,
                                DiscardContext context) {
  return rpc::read_element(context.getParams().getElement())
      .then([context](Element&& element) mutable {
        context.releaseParams();
        context.getResults().setByteCount(element.byte_size());
      });
}

kj::Promise<void> serve_clock(ClockContext context) {
  context.getResults().setNowNs(trace::now_ns());
  return kj::READY_NOW;
}

kj::Promise<void> serve_trace(const DaemonContext& ctx, TraceContext context) {
  const double seconds = context.getParams().getSeconds();
  const uint32_t max_events = context.getParams().getMaxEvents();
  if (!std::isfinite(seconds) || seconds <= 0 || seconds > 600) {
    async::throw_status(Status::InvalidArgument("a trace records for more than 0 and at most 600 seconds, not " +
                                                std::to_string(seconds)));
  }
  trace::Recorder& recorder = trace::Recorder::get();
  Status started = recorder.start_trace(max_events);
  if (!started.ok()) async::throw_status(started);
  ctx.log->info("recording a trace for {} s (at most {} events)", seconds, max_events);
  // A caller that goes away stops the trace with its call.
  auto stop = kj::defer([&recorder]() { (void)recorder.stop_trace(); });
  const auto delay = static_cast<int64_t>(seconds * 1e3) * kj::MILLISECONDS;
  return ctx.loop->timer().afterDelay(delay).then([&ctx, &recorder, context]() mutable {
    trace::TraceCapture capture = recorder.stop_trace();
    auto results = context.getResults();
    auto events = results.initEvents(static_cast<unsigned>(capture.events.size()));
    for (unsigned i = 0; i < events.size(); ++i) rpc::event_to_wire(capture.events[i], events[i]);
    auto threads = results.initThreads(static_cast<unsigned>(capture.threads.size()));
    for (unsigned i = 0; i < threads.size(); ++i) {
      threads[i].setIndex(capture.threads[i].index);
      threads[i].setName(capture.threads[i].name);
    }
    results.setDropped(capture.dropped);
    results.setStartNs(capture.start_ns);
    results.setEndNs(capture.end_ns);
    ctx.log->info("trace recorded: {} events ({} dropped past the bound)", capture.events.size(), capture.dropped);
  }).attach(kj::mv(stop));
}

kj::Promise<void> serve_flight(FlightContext context) {
  trace::Recorder& recorder = trace::Recorder::get();
  std::vector<trace::FlightRecord> records = recorder.flight();
  auto results = context.getResults();
  auto out = results.initRecords(static_cast<unsigned>(records.size()));
  for (unsigned i = 0; i < out.size(); ++i) rpc::flight_to_wire(records[i], out[i]);
  results.setNowNs(trace::now_ns());
  results.setCapacity(static_cast<uint32_t>(recorder.flight_capacity()));
  return kj::READY_NOW;
}

}  // namespace capstan::daemon
