// TensorBoard summaries: tf.summary's file writer, for scalars.
//
//   auto writer = capstan::SummaryWriter::create("/tmp/logs/census").value();
//   for (int64_t step = 1; step <= steps; ++step) {
//     ...
//     writer->scalar("train/loss", loss, step);      // tf.summary.scalar
//   }
//   capstan::Status done = writer->close();          // did every event reach the file?
//
//   $ tensorboard --logdir /tmp/logs
//
// Glossary (TensorBoard's words):
//   logdir      a directory of event files; TensorBoard shows each directory
//               under the one it is given as a run ("census" above).
//   event file  events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n><suffix>,
//               named as TensorFlow names its own (<n> counts the writers
//               this process has created, so two never share a file): a
//               TFRecord file of Event protocol buffers (TensorFlow's
//               event.proto; ours is sdk/src/proto/event.proto). The first
//               Event holds file_version "brain.Event:2"; each scalar() adds
//               one with its wall time, step, tag and value.
//   tag         the name a value is plotted under; TensorBoard groups tags
//               by their part before the first '/' ("train", "test").
//
// Values are stored as float32 (TensorBoard's simple_value). Events are kept
// in memory and written to the file at flush(), at close() and in the
// destructor, and by scalar() once `max_queue` events wait or
// `flush_interval` has passed since the last write, so TensorBoard, which
// re-reads the file as it grows, shows a run while it trains. A flush hands
// the bytes to the operating system; it does not fsync.
//
// Thread-safety: a SummaryWriter may be used from several threads at once
// (a mutex serializes them). read_scalar_events() may be called from any
// thread.
#ifndef CAPSTAN_SUMMARY_H_
#define CAPSTAN_SUMMARY_H_

#include "capstan/export.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "capstan/status.h"

namespace capstan CAPSTAN_API {

// tf.summary.create_file_writer's arguments, with its defaults.
struct SummaryWriterOptions {
  // Appended to the file name (filename_suffix), e.g. ".v2". No '/'.
  std::string filename_suffix;
  // Write to the file once this many events wait (at least 1).
  int max_queue = 10;
  // ... or at a scalar() this long after the last write.
  std::chrono::milliseconds flush_interval{120000};
};

class SummaryWriter {
 public:
  // Creates `logdir` (and its parents) if it does not exist and a new event
  // file in it, which holds the file_version event once this returns.
  // InvalidArgument for an empty logdir or a suffix with '/';
  // FailedPrecondition when `logdir` is not a directory; the system's error
  // (PermissionDenied, ResourceExhausted, ...) naming the path otherwise.
  static Result<std::unique_ptr<SummaryWriter>> create(const std::string& logdir,
                                                       const SummaryWriterOptions& options = {});
  // Closes the file if close() was not called (its result is then lost).
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  // tf.summary.scalar: records `value` (as float32) under `tag` at `step`,
  // stamped with the current wall time. InvalidArgument for an empty tag;
  // FailedPrecondition after close(); a write error (naming the file)
  // sticks: every later call returns it.
  Status scalar(const std::string& tag, double value, int64_t step);

  // Writes the waiting events to the file. After close(): close()'s result.
  Status flush();

  // Flushes and closes the file: OK when every event reached it. A second
  // call returns the first one's result.
  Status close();

  // The event file: "<logdir>/events.out.tfevents.…".
  const std::string& path() const;

 private:
  struct CAPSTAN_HIDDEN Impl;
  explicit SummaryWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One scalar of an event file.
struct ScalarEvent {
  double wall_time = 0;  // seconds since the Unix epoch
  int64_t step = 0;
  std::string tag;
  double value = 0;  // a float32's value
};

// Every scalar (simple_value) in the event file `path`, in file order;
// summaries of other kinds (histograms, TF2's tensor summaries) are skipped.
// Every record's checksums are checked. Errors name the file: NotFound (no
// such file), DataLoss for a damaged or incomplete record (with its offset;
// a writer still writing can leave one at the end: flush it first), a
// record that is not an Event, or a first record that is not the
// file_version event ("brain.Event:…"): not a TensorBoard event file.
Result<std::vector<ScalarEvent>> read_scalar_events(const std::string& path);

}  // namespace capstan

#endif  // CAPSTAN_SUMMARY_H_
