#include "daemons/coordinator/reported_scalars.h"

#include <cmath>
#include <set>

namespace capstan::coordinator {

Status ReportedScalars::add(const std::vector<Scalar>& scalars, double unix_seconds) {
  std::set<std::string> new_tags;
  for (const Scalar& s : scalars) {
    if (s.tag.empty() || s.tag.size() > 128) {
      return Status::InvalidArgument("report_scalar: tag of " + std::to_string(s.tag.size()) +
                                     " bytes; give 1 to 128 bytes, e.g. \"loss\"");
    }
    if (!std::isfinite(s.value)) {
      return Status::InvalidArgument("report_scalar: the value of '" + s.tag + "' is not finite");
    }
    if (points_.count(s.tag) == 0) new_tags.insert(s.tag);
    if (points_.size() + new_tags.size() > kTags) {
      return Status::ResourceExhausted("report_scalar: '" + s.tag + "' would be tag " + std::to_string(kTags + 1) +
                                       "; the coordinator keeps at most " + std::to_string(kTags) +
                                       " (report fewer figures)");
    }
  }
  for (const Scalar& s : scalars) {
    std::deque<Point>& points = points_[s.tag];
    points.push_back({unix_seconds, s.step, s.value});
    while (points.size() > kPoints) points.pop_front();
  }
  return Status::Ok();
}

}  // namespace capstan::coordinator
