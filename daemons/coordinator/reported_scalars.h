// ReportedScalars: a program's training figures (ClusterCoordinator::
// report_scalar: loss, accuracy, examples/s) as the coordinator keeps them
// for its status page's plots: the last kPoints of at most kTags tags.
//
// Not thread-safe: the Coordinator uses it on its loop thread.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_REPORTED_SCALARS_H_
#define CAPSTAN_DAEMONS_COORDINATOR_REPORTED_SCALARS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "capstan/status.h"

namespace capstan::coordinator {

class ReportedScalars {
 public:
  static constexpr size_t kPoints = 600;
  static constexpr size_t kTags = 32;
  struct Point {
    double unix_seconds = 0;
    int64_t step = 0;
    double value = 0;
  };
  struct Scalar {
    std::string tag;
    double value = 0;
    int64_t step = 0;
  };

  // Keeps all of `scalars` or, with any refused, none: InvalidArgument for
  // an empty tag or one over 128 bytes, a value that is not finite;
  // ResourceExhausted for a new tag beyond kTags.
  [[nodiscard]] Status add(const std::vector<Scalar>& scalars, double unix_seconds);
  // By tag, oldest point first.
  const std::map<std::string, std::deque<Point>>& points() const { return points_; }

 private:
  std::map<std::string, std::deque<Point>> points_;
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_REPORTED_SCALARS_H_
