// write_scalars: writes a TensorBoard event file of known scalars with
// capstan::SummaryWriter (through libcapstan.so, as a training program
// would), reads it back with capstan::read_scalar_events, and prints what
// it read, for tests/scripts/tensorboard_read_test.sh to compare with what
// TensorBoard's own reader finds:
//
//   write_scalars LOGDIR
//   path LOGDIR/events.out.tfevents.1700000000.host.123.0
//   scalar train/loss 1 1 1700000000.1234567
//   ...                 (tag, step, value as %.9g, wall time as %.17g)
#include <capstan/summary.h>

#include <cmath>
#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_scalars LOGDIR\n");
    return 2;
  }
  auto writer = capstan::SummaryWriter::create(argv[1]);
  if (!writer.ok()) {
    std::fprintf(stderr, "write_scalars: %s\n", writer.status().to_string().c_str());
    return 1;
  }
  capstan::Status status;
  // Values that are not exact in float32 (1/3, 0.1 steps) and a negative
  // one, so that a reader that mistook the width would not match.
  for (int64_t step = 1; status.ok() && step <= 20; ++step) {
    const double s = static_cast<double>(step);
    status = (*writer)->scalar("train/loss", 1.0 / (3.0 * s), step);
    if (status.ok()) status = (*writer)->scalar("train/accuracy", 0.5 + 0.02 * s, step);
    if (status.ok() && step % 10 == 0) status = (*writer)->scalar("test/auc", 0.8 + 0.01 * s, step);
    if (status.ok() && step % 10 == 0) status = (*writer)->scalar("test/log_loss", -std::log(0.7 + 0.01 * s), step);
  }
  if (status.ok()) status = (*writer)->scalar("train/examples_per_second", 12345.678, 1 << 20);
  if (status.ok()) status = (*writer)->close();
  if (!status.ok()) {
    std::fprintf(stderr, "write_scalars: %s\n", status.to_string().c_str());
    return 1;
  }
  const std::string path = (*writer)->path();
  auto events = capstan::read_scalar_events(path);
  if (!events.ok()) {
    std::fprintf(stderr, "write_scalars: %s\n", events.status().to_string().c_str());
    return 1;
  }
  std::printf("path %s\n", path.c_str());
  for (const auto& event : *events) {
    std::printf("scalar %s %lld %.9g %.17g\n", event.tag.c_str(), static_cast<long long>(event.step), event.value,
                event.wall_time);
  }
  return 0;
}
