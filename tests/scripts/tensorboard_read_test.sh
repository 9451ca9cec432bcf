#!/usr/bin/env bash
# TensorBoard reads the event files the SDK writes. write_scalars
# (tests/tools) writes known scalars with capstan::SummaryWriter and prints
# what capstan::read_scalar_events reads back; TensorBoard's own readers
# (the tensorboard package: its record loader, which checks the CRCs, and
# EventAccumulator, what `tensorboard --logdir` builds on) must find the
# file_version event first and the same tags, steps, values and wall times.
#
# Usage: tests/scripts/tensorboard_read_test.sh BUILD_DIR WRITE_SCALARS
#   (run by CTest as tensorboard_reads_sdk_event_files)
#
# TensorBoard comes from a virtual environment made once, on the first run,
# in BUILD_DIR/tensorboard-venv (`pip install tensorboard`: PyPI, or the
# index pip is configured for). CAPSTAN_TENSORBOARD_PYTHON=/path/to/python
# uses an interpreter that already has tensorboard instead (machines
# without a package index).
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR WRITE_SCALARS" >&2
  exit 2
fi
build_dir=$(cd "$1" && pwd)
write_scalars=$2
. "$(dirname "$0")/../../scripts/pypi_venv.sh"

fail() {
  echo "FAIL: $*"
  echo "tensorboard_read_test: 0 passed, 1 failed"
  exit 1
}

# An interpreter with tensorboard.
python=$(pypi_test_python "$build_dir" tensorboard "tensorboard" "${CAPSTAN_TENSORBOARD_PYTHON:-}" CAPSTAN_TENSORBOARD_PYTHON tensorboard) ||
  fail "no python with tensorboard (above)"

work=$(mktemp -d "${TMPDIR:-/tmp}/capstan-tensorboard-test.XXXXXX")
trap 'rm -rf "$work"' EXIT

"$write_scalars" "$work/logs/run" >"$work/written.txt" || fail "write_scalars failed"
path=$(awk '$1 == "path" {print $2}' "$work/written.txt")
[[ -f $path ]] || fail "write_scalars named no event file ($(head -n 1 "$work/written.txt"))"
echo "event file: $path ($(stat -c %s "$path") bytes, $(grep -c '^scalar ' "$work/written.txt") scalars)"

disagree="TensorBoard's readers disagree with capstan::read_scalar_events (above)"
"$python" - "$path" "$work/written.txt" <<'EOF' || fail "$disagree"
import struct
import sys
import warnings

warnings.filterwarnings("ignore")
import tensorboard
from tensorboard.backend.event_processing import event_accumulator, event_file_loader

path, written = sys.argv[1], sys.argv[2]
errors = []


def check(ok, what):
    if not ok:
        errors.append(what)


def float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


# What capstan::read_scalar_events read: (tag, step, float32 value, wall time).
expected = []
with open(written) as f:
    for line in f:
        fields = line.split()
        if fields[0] == "scalar":
            expected.append((fields[1], int(fields[2]), float32(float(fields[3])), float(fields[4])))
check(len(expected) == 45, "write_scalars printed %d scalars, not 45" % len(expected))

# Every record through TensorBoard's record reader, as written (the loader
# without TensorBoard's conversion of simple_value to tensors).
loader = getattr(event_file_loader, "LegacyEventFileLoader", event_file_loader.EventFileLoader)
events = list(loader(path).Load())
check(len(events) == 1 + len(expected), "%d events in the file, not %d" % (len(events), 1 + len(expected)))
check(events[0].file_version == "brain.Event:2", "first event: %r, not file_version brain.Event:2" % events[0])
check(events[0].wall_time > 1.5e9, "the file_version event's wall time is %r" % events[0].wall_time)
for event, (tag, step, value, wall_time) in zip(events[1:], expected):
    values = event.summary.value
    check(len(values) == 1 and values[0].tag == tag and values[0].HasField("simple_value")
          and values[0].simple_value == value and event.step == step and event.wall_time == wall_time,
          "event %r, expected tag %s step %d value %r wall time %r" % (event, tag, step, value, wall_time))

# What TensorBoard's scalar dashboard is built from.
accumulator = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.SCALARS: 0})
accumulator.Reload()
check(accumulator.file_version == 2.0, "EventAccumulator's file_version is %r" % accumulator.file_version)
tags = sorted(set(e[0] for e in expected))
check(sorted(accumulator.Tags()["scalars"]) == tags,
      "EventAccumulator's scalar tags %r, expected %r" % (accumulator.Tags()["scalars"], tags))
for tag in tags:
    got = [(e.step, e.value, e.wall_time) for e in accumulator.Scalars(tag)]
    want = [(step, value, wall_time) for t, step, value, wall_time in expected if t == tag]
    check(got == want, "%s: EventAccumulator read %r, expected %r" % (tag, got, want))

print("tensorboard %s: %d events; scalars %s" % (tensorboard.__version__, len(events), ", ".join(
    "%s (%d)" % (tag, len(accumulator.Scalars(tag))) for tag in tags)))
for error in errors:
    print("FAIL: " + error)
sys.exit(1 if errors else 0)
EOF
echo "PASS: TensorBoard reads the SDK's event file: file_version first, every scalar's tag, step, value and wall time"
echo "tensorboard_read_test: 1 passed, 0 failed"
