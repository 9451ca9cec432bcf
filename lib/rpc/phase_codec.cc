#include "rpc/phase_codec.h"

#include <algorithm>
#include <cmath>

namespace capstan::rpc {
namespace {

double seconds(double v, double most) { return std::isfinite(v) ? std::clamp(v, 0.0, most) : 0.0; }

}  // namespace

void phases_to_wire(const PhaseTimes& in, wire::RunPhases::Builder out) {
  out.setInput(in.input);
  out.setPs(in.ps);
  out.setCollective(in.collective);
  out.setTotal(in.total);
}

PhaseTimes phases_from_wire(wire::RunPhases::Reader in) {
  PhaseTimes phases;
  phases.total = seconds(in.getTotal(), 1e9);
  phases.input = seconds(in.getInput(), phases.total);
  phases.ps = seconds(in.getPs(), phases.total);
  phases.collective = seconds(in.getCollective(), phases.total);
  return phases;
}

void phases_to_wire(const PhaseTimes& in, wire::WorkerStats::Builder out) {
  out.setQueued(in.queued);
  out.setInput(in.input);
  out.setPs(in.ps);
  out.setCollective(in.collective);
  out.setTotal(in.total);
}

PhaseTimes phases_from_wire(wire::WorkerStats::Reader in) {
  PhaseTimes phases;
  phases.queued = in.getQueued();
  phases.input = in.getInput();
  phases.ps = in.getPs();
  phases.collective = in.getCollective();
  phases.total = in.getTotal();
  return phases;
}

}  // namespace capstan::rpc
