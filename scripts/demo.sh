#!/usr/bin/env bash
# The demo, the main job: TensorFlow's wide-and-deep census model trained on
# the UCI Adult data by a local Capstan cluster.
#
# Usage: scripts/demo.sh [census options...]   (e.g. --epochs 8, --seed 1,
#                                               --mode ps|sync|hybrid|strategy|strategy-hybrid,
#                                               --trace FILE: a Chrome trace of 5 s of the
#                                               cluster and census, 2 s in)
#
#   1. scripts/build.sh: installs what is missing and builds (incremental;
#      its output goes to RUN_DIR/build.log, a progress line shows [n/m]);
#   2. scripts/local-cluster.sh up: a coordinator, 2 parameter servers and
#      2 workers, a data dispatcher and 2 data workers, all loading the
#      census example's modules, in the run directory .run/demo;
#   3. build/bin/census (examples/census): the data workers read and parse
#      examples/census/data/adult.data.gz (TextLine GZIP, decode_csv, the
#      feature columns, shuffle, batch) and serve the batches to the
#      training workers; the model is a LibTorch module (torch_model.h:
#      autograd, capstan::torch::PsModule; --model eigen trains the
#      hand-written Eigen one); the wide table and the embeddings are partitioned
#      across both parameter servers and updated sparsely, the MLP densely,
#      asynchronously by both workers, with a live progress line; after each
#      epoch, accuracy, AUC and log-loss on all of adult.test; at the end,
#      the metrics against their targets and a checkpoint;
#   4. stops the cluster, whatever happened (CAPSTAN_DEMO_KEEP=1 leaves it
#      running, to look at its status pages), says where the logs are and
#      what to try next.
#
# --mode sync trains the same LibTorch module synchronously instead: 2
# replica processes (started by the census program, torchrun-style) form a
# collective group through the coordinator, and each trains the module with
# capstan::torch::MirroredModule: every parameter (the wide table and the
# embeddings too) mirrored, the gradients all-reduced in buckets during
# backward; --mode hybrid keeps the wide table and the embeddings on the
# parameter servers (capstan::torch::Embedding, pulled and pushed each step)
# and mirrors the MLP, in one backward. --model eigen trains the Eigen model
# in these modes too. --mode strategy trains the same LibTorch module
# synchronously on the 2 worker-servers instead, driven by this one program
# (MirroredStrategy: each step runs on both workers at once as the replicas
# of one group; each worker's module is attached to its replicas with
# capstan::torch::MirroredModule::attach and all-reduces its gradients
# during backward); --mode strategy-hybrid keeps the wide table and the
# embeddings on the parameter servers and mirrors the MLP. Where LibTorch
# is not installed, every mode trains the Eigen model.
#
# The exit status is the census program's: 0 when the test accuracy is at
# least 85.0% and the AUC at least 0.90.
#
# Environment: CAPSTAN_BUILD_DIR (default build), CAPSTAN_JOBS (build
# parallelism, default 2), CAPSTAN_DEMO_RUN_DIR (default .run/demo),
# CAPSTAN_DEMO_KEEP (1: leave the cluster running at the end).
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Paths given to census (--trace FILE, --logdir DIR, ...) are the caller's:
# made absolute before the cd below.
args=()
for ((i = 1; i <= $#; i++)); do
  arg=${!i}
  args+=("$arg")
  if [[ $arg == --trace || $arg == --logdir || $arg == --step-log || $arg == --checkpoint-dir ]] && ((i < $#)); then
    i=$((i + 1))
    value=${!i}
    [[ $value == /* ]] || value=$PWD/$value
    args+=("$value")
  fi
done
set -- "${args[@]+"${args[@]}"}"
cd "$repo_root"

build_dir=${CAPSTAN_BUILD_DIR:-build}
case "$build_dir" in /*) ;; *) build_dir=$repo_root/$build_dir ;; esac
run_dir=${CAPSTAN_DEMO_RUN_DIR:-$repo_root/.run/demo}
bin_dir=$build_dir/bin
module=$build_dir/lib/libcensus_module.so
# The LibTorch model's closures (ps mode's default model), when the build has
# LibTorch (CAPSTAN_TORCH; scripts/setup.sh installs it).
torch_module=$build_dir/lib/libcensus_torch_module.so

started=$SECONDS
section() { printf '\n== %s (%ds)\n' "$1" $(( SECONDS - started )); }

section "building (scripts/build.sh; output in $run_dir/build.log)"
mkdir -p "$run_dir"
# Ninja's "[n/m]" lines become one progress line; everything goes to the log.
build_status=0
bash scripts/build.sh >"$run_dir/build.log" 2>&1 &
build_pid=$!
tty_progress=0
[[ -t 1 ]] && tty_progress=1
last_shown=""
while kill -0 "$build_pid" 2>/dev/null; do
  step=$(grep -ao '^\[[0-9]*/[0-9]*\]' "$run_dir/build.log" 2>/dev/null | tail -n 1 || true)
  if [[ -n "$step" && "$step" != "$last_shown" ]]; then
    if [[ $tty_progress == 1 ]]; then printf '\r  compiling %s ' "$step"; fi
    last_shown=$step
  fi
  sleep 1
done
wait "$build_pid" || build_status=$?
if [[ $tty_progress == 1 && -n "$last_shown" ]]; then printf '\n'; fi
if [[ $build_status -ne 0 ]]; then
  echo "demo.sh: the build failed (exit $build_status); the end of $run_dir/build.log:" >&2
  tail -n 40 "$run_dir/build.log" >&2
  exit "$build_status"
fi
steps=$(grep -c '^\[[0-9]*/[0-9]*\]' "$run_dir/build.log" || true)
if [[ ${steps:-0} == 0 ]]; then echo "  up to date"; else echo "  built: $steps steps"; fi

for file in "$bin_dir/census" "$module"; do
  [[ -e "$file" ]] || { echo "demo.sh: $file was not built" >&2; exit 1; }
done

cluster() { bash scripts/local-cluster.sh "$1" --run-dir "$run_dir" --bin-dir "$bin_dir" "${@:2}"; }

cluster_started=0
# The status page of daemon NAME (its HTTP port from local-cluster.sh's port file).
status_url() {
  local port
  port=$(sed -n 's/^http_port: *//p' "$run_dir/ports/$1.port" 2>/dev/null || true)
  echo "http://127.0.0.1:${port:-?}/"
}
# shellcheck disable=SC2317  # run by the EXIT trap
next_steps() {
  local checkpoint
  checkpoint=$(find "$run_dir/checkpoints" -maxdepth 1 -name 'ckpt-*' 2>/dev/null | sort -V | tail -n 1 || true)
  cat <<EOF

What next:
  - watch a run live: CAPSTAN_DEMO_KEEP=1 scripts/demo.sh --epochs 20, then open the
    coordinator's status page (members, placement, closures/s, the loss) and the
    data dispatcher's (jobs, data workers); /metrics beside them for Prometheus
  - run a cluster by hand with the census module (README: "Run a cluster by hand"):
      scripts/local-cluster.sh up --module $module --data-workers 2
      . .run/cluster/cluster.env
      $bin_dir/census --coordinator \$COORDINATOR --dispatcher \$DISPATCHER --min-workers 2
  - look into the checkpoint: $bin_dir/capstanctl checkpoint inspect ${checkpoint:-$run_dir/checkpoints/ckpt-N}
    (a program restores it with cluster->restore_checkpoint(path, /*strict=*/true))
  - the same cluster in containers: cd deploy/docker && docker-compose up --build --exit-code-from census
EOF
}
# shellcheck disable=SC2317  # run by the EXIT trap
shutdown() {
  local status=$?
  trap - EXIT INT TERM
  if [[ $cluster_started == 1 && ${CAPSTAN_DEMO_KEEP:-0} == 1 ]]; then
    section "the cluster keeps running (CAPSTAN_DEMO_KEEP=1)"
    echo "status pages: coordinator $(status_url coordinator), data dispatcher $(status_url data-dispatcher)"
    echo "stop it with: scripts/local-cluster.sh down --run-dir $run_dir"
  elif [[ $cluster_started == 1 ]]; then
    section "stopping the cluster"
    cluster down >/dev/null 2>&1 || echo "demo.sh: stopping the cluster failed; see $run_dir" >&2
    echo "daemon logs: $run_dir/logs/ (coordinator.log, ps0.log, ps1.log, worker0.log, worker1.log, ...)"
  fi
  if [[ $cluster_started == 1 ]]; then next_steps; fi
  exit "$status"
}
trap shutdown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

section "starting a local cluster in $run_dir"
# A demo cluster left over from an interrupted run goes first.
cluster down >/dev/null 2>&1 || true
cluster_started=1
modules=(--module "$module")
[[ -e "$torch_module" ]] && modules+=(--module "$torch_module")
cluster up --ps 2 --workers 2 --data-workers 2 "${modules[@]}"
# shellcheck disable=SC1091  # written by local-cluster.sh up
. "$run_dir/cluster.env"
echo "status pages: coordinator $(status_url coordinator), data dispatcher $(status_url data-dispatcher)"

section "training and evaluating (examples/census)"
# Each demo trains from scratch: an earlier demo's checkpoint of the same
# step would make the save refuse to overwrite it.
rm -rf "$run_dir/checkpoints"
status=0
"$bin_dir/census" --coordinator "$COORDINATOR" --dispatcher "$DISPATCHER" --min-workers 2 \
  --data-dir "$repo_root/examples/census/data" --checkpoint-dir "$run_dir/checkpoints" "$@" || status=$?
if [[ $status -eq 0 ]]; then
  echo "demo: done in $(( SECONDS - started )) s: the census model meets its targets on adult.test"
else
  echo "demo: the census example exited with status $status"
fi
exit "$status"
