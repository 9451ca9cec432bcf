#!/usr/bin/env bash
# Trains the census example (examples/census) for one epoch in MODE on a
# local cluster (2 PS, 2 workers, the data service with 2 data workers), and
# checks that its accuracy on adult.test beats the majority class (76.4%):
# the program exits non-zero below --target-accuracy, and the test reads its
# report. MODE is ps (the data workers parse adult.data), sync (2 replica
# processes, every variable mirrored and all-reduced) or hybrid (tables on
# the parameter servers, the MLP mirrored), strategy (the 2 worker-servers
# are the replicas of MirroredStrategy::run, fed by the data service) or
# strategy-hybrid (the same, the tables on the parameter servers), both
# with the LibTorch model when TORCH_MODULE is given (the workers load it;
# MirroredModule attached to each worker's replicas), else the Eigen one;
# "deterministic" runs sync mode with one replica and --seed twice and
# checks that the metrics are equal; "torch" is ps mode with the LibTorch
# model (TORCH_MODULE loaded beside MODULE), whose checkpoint names the
# variables after the module's parameters; "torch-sync" and "torch-hybrid"
# are sync and hybrid modes with the LibTorch model (each replica trains it
# with capstan::torch::MirroredModule; the program's plugin, no module on
# the workers). ps, sync, hybrid and deterministic run the Eigen model.
# "below-target" runs sync mode with one replica and a target accuracy no
# epoch reaches (99%): the program must print its FAIL line and exit 1.
# "sync-restart" and "torch-sync-restart" start 3 replica processes by hand
# (--rank R --group G, as a supervisor would), kill -9 rank 1 once epoch 1
# is done and start it again: the survivors re-form the group with it, it
# rejoins with the group's variables and input position, and every epoch
# trains on every example exactly once (rank 0 counts the ids).
#
# Usage: tests/scripts/census_test.sh REPO_ROOT BIN_DIR MODULE PROGRAM MODE [TORCH_MODULE]
#   (run by CTest as examples_census_*)
set -euo pipefail

if [[ $# -ne 5 && $# -ne 6 ]]; then
  echo "usage: $0 REPO_ROOT BIN_DIR MODULE PROGRAM ps|sync|hybrid|strategy|strategy-hybrid|deterministic|below-target|sync-restart|torch|torch-sync|torch-hybrid|torch-sync-restart [TORCH_MODULE]" >&2
  exit 2
fi
# shellcheck source=tests/scripts/local_cluster.sh
. "$(dirname "$0")/local_cluster.sh" "$1" "$2"
module=$3
program=$4
mode=$5
torch_module=${6:-}

modules=(--module "$module")
if [[ $mode == torch ]]; then
  [[ -n $torch_module ]] || result fail "mode torch needs TORCH_MODULE"
fi
if [[ -n $torch_module ]]; then
  modules+=(--module "$torch_module")
fi
if ! bash "$script" up --run-dir "$run_dir" --bin-dir "$bin_dir" --ps 2 --workers 2 --data-workers 2 \
  "${modules[@]}"; then
  result fail "local-cluster.sh up --module $module failed"
fi
# shellcheck disable=SC1091  # written by local-cluster.sh
. "$run_dir/cluster.env"

run_census() {  # OUTPUT_FILE ARGS...
  local out=$1
  shift
  local rc=0
  timeout 240 "$program" --coordinator "$COORDINATOR" --data-dir "$repo_root/examples/census/data" --epochs 1 \
    --target-accuracy 0.764 --target-auc 0.5 "$@" >"$out" 2>&1 || rc=$?
  cat "$out"
  if [[ $rc -ne 0 ]]; then
    result fail "census $* exited with status $rc"
  fi
}

output_file=$run_dir/census.out
case "$mode" in
  torch)
    run_census "$output_file" --mode ps --model torch --dispatcher "$DISPATCHER" --min-workers 2 --seed 1 \
      --checkpoint-dir "$run_dir/checkpoints"
    grep -q "in LibTorch, ps mode" "$output_file" || result fail "the report does not say it trained the LibTorch model"
    # The checkpoint names each variable after the module's parameters.
    for name in census/wide.weight census/embeddings.weight census/deep.0.weight census/deep.8.bias; do
      grep -rqF "$name" "$run_dir"/checkpoints/ || result fail "the checkpoint has no variable '$name'"
    done
    ;;
  ps)
    run_census "$output_file" --mode ps --model eigen --dispatcher "$DISPATCHER" --min-workers 2 --seed 1 \
      --checkpoint-dir "$run_dir/checkpoints" --logdir "$run_dir/logs/tensorboard"
    if ! ls "$run_dir"/checkpoints/*/ >/dev/null 2>&1; then
      result fail "no checkpoint under $run_dir/checkpoints"
    fi
    # --logdir: one TensorBoard event file with the training and test figures.
    events=("$run_dir"/logs/tensorboard/events.out.tfevents.*)
    if [[ ${#events[@]} -ne 1 || ! -s ${events[0]} ]] || ! grep -q "train/loss" "${events[0]}" ||
      ! grep -q "test/auc" "${events[0]}"; then
      result fail "--logdir wrote no event file with train/loss and test/auc: ${events[*]}"
    fi
    # The side-car evaluator, on that checkpoint in its own memory (no PS),
    # finds the accuracy the program measured through the cluster.
    if ! timeout 120 "$bin_dir/evaluator" --once --checkpoint-dir "$run_dir/checkpoints" --module "$module" \
      --closure census_evaluate --arg "string:$repo_root/examples/census/data/adult.test.gz" --arg int64:1 \
      --arg int64:0 --metrics-file "$run_dir/metrics.jsonl" >"$run_dir/evaluator.out" 2>&1; then
      cat "$run_dir/evaluator.out"
      result fail "evaluator --once failed"
    fi
    cat "$run_dir/evaluator.out"
    program_accuracy=$(sed -n 's/^epoch .* test: accuracy \([0-9.]*\) .*/\1/p' "$output_file" | tail -n 1)
    evaluator_accuracy=$(sed -n 's/.*"accuracy":\([0-9.e-]*\).*/\1/p' "$run_dir/metrics.jsonl")
    evaluator_examples=$(sed -n 's/.*"examples":\([0-9]*\).*/\1/p' "$run_dir/metrics.jsonl")
    if [[ -z $evaluator_accuracy || $(printf '%.4f' "$evaluator_accuracy") != "$program_accuracy" ||
      $evaluator_examples != 16281 ]]; then
      result fail "the evaluator's accuracy '$evaluator_accuracy' over '$evaluator_examples' examples is not the program's '$program_accuracy' over 16281"
    fi
    ;;
  sync | hybrid | torch-sync | torch-hybrid)
    # sync runs the pipeline in each replica; hybrid reads from the data service.
    model=eigen
    sync_mode=$mode
    if [[ $mode == torch-* ]]; then
      model=torch
      sync_mode=${mode#torch-}
    fi
    extra=()
    if [[ $sync_mode == hybrid ]]; then extra=(--dispatcher "$DISPATCHER"); fi
    run_census "$output_file" --mode "$sync_mode" --model "$model" --replicas 2 --seed 1 \
      --checkpoint-dir "$run_dir/checkpoints" --logdir "$run_dir/logs/tensorboard" "${extra[@]}"
    if ! ls "$run_dir"/checkpoints/*/ >/dev/null 2>&1; then
      result fail "no checkpoint under $run_dir/checkpoints"
    fi
    if [[ $model == torch ]]; then
      grep -q "in LibTorch, $sync_mode mode" "$output_file" ||
        result fail "the report does not say it trained the LibTorch model in $sync_mode mode"
      # Named after the module's parameters, as ps mode's checkpoint.
      for name in census/wide.weight census/bias census/embeddings.weight census/deep.0.weight census/deep.8.bias; do
        grep -rqF "$name" "$run_dir"/checkpoints/ || result fail "the checkpoint has no variable '$name'"
      done
    fi
    # --logdir: rank 0 alone writes events.
    events=("$run_dir"/logs/tensorboard/events.out.tfevents.*)
    if [[ ${#events[@]} -ne 1 ]] || ! grep -q "train/loss" "${events[0]}"; then
      result fail "expected one event file (rank 0's) with train/loss: ${events[*]}"
    fi
    if ! grep -q "the 2 replicas' mirrored variables are identical" "$output_file"; then
      result fail "the report does not say that the replicas are identical"
    fi
    ;;
  strategy | strategy-hybrid)
    model=eigen
    [[ -n $torch_module ]] && model=torch
    # strategy: the exactly-once step input (no data service), which counts
    # every example of the epoch by id; strategy-hybrid: each worker's shard
    # through the data service.
    input=()
    [[ $mode == strategy-hybrid ]] && input=(--dispatcher "$DISPATCHER")
    run_census "$output_file" --mode "$mode" --model "$model" "${input[@]}" --min-workers 2 --seed 1 \
      --checkpoint-dir "$run_dir/checkpoints"
    if [[ $mode == strategy ]] && ! grep -q "epoch 1 trained on every example exactly once (32561 ids)" "$output_file"; then
      result fail "the report does not say that epoch 1 trained on every example exactly once"
    fi
    if ! ls "$run_dir"/checkpoints/*/ >/dev/null 2>&1; then
      result fail "no checkpoint under $run_dir/checkpoints"
    fi
    if [[ $model == torch ]]; then
      grep -q "in LibTorch, $mode mode" "$output_file" ||
        result fail "the report does not say it trained the LibTorch model in $mode mode"
      # Named after the module's parameters, as the other modes' checkpoints.
      for name in census/wide.weight census/bias census/embeddings.weight census/deep.0.weight census/deep.8.bias; do
        grep -rqF "$name" "$run_dir"/checkpoints/ || result fail "the checkpoint has no variable '$name'"
      done
    fi
    if ! grep -q "the 2 replicas' mirrored variables are identical" "$output_file"; then
      result fail "the report does not say that the 2 replicas are identical"
    fi
    ;;
  sync-restart | torch-sync-restart)
    model=eigen
    [[ $mode == torch-* ]] && model=torch
    group=census-restart-$$
    replica_args=(--coordinator "$COORDINATOR" --data-dir "$repo_root/examples/census/data" --epochs 4
      --mode sync --model "$model" --replicas 3 --group "$group" --seed 1 --target-accuracy 0.764
      --target-auc 0.5)
    pids=()
    # The replicas' own pids (no timeout wrapper: the signals are for them);
    # ctest's timeout bounds the test, and the trap stops what is left.
    for rank in 0 1 2; do
      "$program" "${replica_args[@]}" --rank "$rank" >"$run_dir/rank$rank.out" 2>&1 &
      pids+=($!)
    done
    stop_replicas() { kill -9 "${pids[@]}" 2>/dev/null || true; }
    trap 'test_status=$?; stop_replicas; set +e; (exit $test_status); cleanup' EXIT TERM
    # Epoch 1 done (rank 0 checked its examples): rank 1 dies, and comes
    # back. The others are held (SIGSTOP) around the kill, so that it lands
    # mid-run however fast the epochs go.
    for _ in $(seq 1 900); do
      grep -q "epoch 1 trained on every example exactly once" "$run_dir/rank0.out" && break
      kill -0 "${pids[0]}" 2>/dev/null || break
      sleep 0.1
    done
    grep -q "epoch 1 trained on every example exactly once" "$run_dir/rank0.out" ||
      { cat "$run_dir"/rank*.out; result fail "rank 0 did not finish epoch 1"; }
    kill -STOP "${pids[0]}" "${pids[2]}"
    kill -9 "${pids[1]}"
    wait "${pids[1]}" 2>/dev/null || true
    kill -CONT "${pids[0]}" "${pids[2]}"
    sleep 1
    "$program" "${replica_args[@]}" --rank 1 >"$run_dir/rank1-again.out" 2>&1 &
    pids[1]=$!
    for rank in 0 1 2; do
      rc=0
      wait "${pids[$rank]}" || rc=$?
      if [[ $rc -ne 0 ]]; then
        cat "$run_dir"/rank*.out
        result fail "rank $rank exited with status $rc"
      fi
    done
    cat "$run_dir/rank0.out" "$run_dir/rank1-again.out"
    cp "$run_dir/rank0.out" "$output_file"
    grep -q "re-forming group '$group'" "$run_dir/rank0.out" ||
      result fail "rank 0 did not re-form the group after rank 1 was killed"
    grep -qE "census rank 1: rejoined group '$group' \(generation [2-9]\) at step [1-9][0-9]*, input position [1-9]" \
      "$run_dir/rank1-again.out" || result fail "the restarted rank 1 did not rejoin with the group's state"
    for epoch in 1 2 3 4; do
      grep -q "epoch $epoch trained on every example exactly once (32561 ids)" "$run_dir/rank0.out" ||
        result fail "epoch $epoch: rank 0 does not say every example was trained on exactly once"
    done
    grep -q "the 3 replicas' mirrored variables are identical" "$run_dir/rank0.out" ||
      result fail "the report does not say that the 3 replicas are identical"
    ;;
  deterministic)
    run_census "$run_dir/first.out" --mode sync --model eigen --replicas 1 --seed 7
    run_census "$run_dir/second.out" --mode sync --model eigen --replicas 1 --seed 7
    first=$(grep -E '^(  accuracy|  AUC|  log-loss|epoch .* test:)' "$run_dir/first.out")
    second=$(grep -E '^(  accuracy|  AUC|  log-loss|epoch .* test:)' "$run_dir/second.out")
    if [[ -z $first || $first != "$second" ]]; then
      result fail "two runs with --seed 7 gave different metrics: '$first' vs '$second'"
    fi
    result pass "two runs with --seed 7 gave the same metrics: $(echo "$first" | tr '\n' ' ')"
    ;;
  below-target)
    rc=0
    timeout 240 "$program" --coordinator "$COORDINATOR" --data-dir "$repo_root/examples/census/data" --epochs 1 \
      --mode sync --model eigen --replicas 1 --seed 7 --target-accuracy 0.99 --target-auc 0.5 \
      >"$output_file" 2>&1 || rc=$?
    cat "$output_file"
    if [[ $rc -ne 1 ]]; then
      result fail "census below its target accuracy exited with status $rc, not 1"
    fi
    if ! grep -qE '^  accuracy  [0-9.]+%   \(target: at least 99\.0%\) FAIL$' "$output_file"; then
      result fail "census below its target accuracy printed no FAIL line for it"
    fi
    if ! grep -qE '^  AUC .*\(target: at least 0\.50\) PASS$' "$output_file"; then
      result fail "census printed no PASS line for the AUC target it met"
    fi
    result pass "below-target: census exits 1 and prints FAIL when its accuracy is below --target-accuracy 0.99"
    ;;
  *)
    result fail "unknown mode '$mode'"
    ;;
esac
accuracy=$(sed -n 's/^  accuracy  \([0-9.]*\)%.*/\1/p' "$output_file")
examples=$(sed -n 's/^census: adult.test (\([0-9]*\) examples.*/\1/p' "$output_file")
if [[ -z $accuracy || $examples != 16281 ]]; then
  result fail "no accuracy over adult.test's 16281 examples in the report (accuracy '$accuracy', examples '$examples')"
fi
if awk -v a="$accuracy" 'BEGIN { exit !(a > 76.4) }'; then
  result pass "$mode: one epoch reaches ${accuracy}% on adult.test (majority class: 76.4%)"
fi
result fail "$mode: accuracy ${accuracy}% does not beat the majority class (76.4%)"
