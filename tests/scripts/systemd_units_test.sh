#!/usr/bin/env bash
# Checks the systemd units in deploy/systemd without installing them:
#
#   1. the layout deploy/README.md documents: each unit runs
#      /opt/capstan/bin/<daemon> (the README's install prefix), the daemon
#      exists in BIN_DIR, the unit has DynamicUser=yes, ProtectSystem=strict
#      and a StateDirectory=capstan/..., and the coordinator's work_dir and
#      checkpoint_dir and the dispatcher's work_dir lie in a state
#      directory (the only place the daemon can write);
#   2. `systemd-analyze verify` on every unit: copies in a temporary directory
#      with /opt/capstan/bin/ replaced by BIN_DIR (verify requires ExecStart's
#      binary to exist), templates through an instance (capstan-ps-server@0).
#      Nothing of the real system changes.
#
# systemd-analyze exits 0 on some problems (an unknown key, a bad value: it
# logs them and goes on), so its output counts too: a unit fails when verify
# exits non-zero or prints any line that mentions the unit, its file or
# "capstan". Lines about other units (the host's own, which verify loads as
# dependencies, e.g. network-online.target) say nothing about ours: they are
# shown as notes and do not fail the test. No line about our units is known
# to be harmless.
#
# Then it checks itself: broken copies (an unknown key, a bad value, a
# missing binary, a checkpoint_dir outside the state directory) must fail.
#
# Usage: systemd_units_test.sh REPO_ROOT BIN_DIR
#   Fails where systemd-analyze is not installed (scripts/setup.sh --test).
set -euo pipefail

repo=$(cd "$1" && pwd)
bin=$(cd "$2" && pwd)
units_dir=$repo/deploy/systemd
prefix_bin=/opt/capstan/bin

if ! command -v systemd-analyze > /dev/null; then
  echo "FAIL: systemd-analyze is not installed (scripts/setup.sh --test installs systemd)"
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# verify may run as another user than the files' owner: keep them readable.
chmod 755 "$tmp"
passed=0
failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }

verify_options=(--man=no)
if systemd-analyze --help 2>/dev/null | grep -q -- '--recursive-errors'; then
  # Only our units decide; the host's units are not under test.
  verify_options+=(--recursive-errors=no)
fi

# value FILE KEY: the values of KEY= in FILE, one a line.
value() { sed -n "s/^$2=//p" "$1"; }

# check_layout FILE: the documented layout (part 1). Prints the problems.
check_layout() {
  local file=$1 name daemon exec state
  name=$(basename "$file")
  daemon=${name#capstan-}
  daemon=${daemon%.service}
  daemon=${daemon%@}
  local problems=0
  say() { echo "$name: $*"; problems=$((problems + 1)); }
  exec=$(value "$file" ExecStart)
  [[ $exec == "$prefix_bin/$daemon "* || $exec == "$prefix_bin/$daemon" ]] ||
    say "ExecStart=$exec does not run $prefix_bin/$daemon"
  [[ -x $bin/$daemon ]] || say "$bin/$daemon does not exist"
  [[ $(value "$file" DynamicUser) == yes ]] || say "no DynamicUser=yes"
  [[ $(value "$file" ProtectSystem) == strict ]] || say "no ProtectSystem=strict"
  local states
  read -ra states <<<"$(value "$file" StateDirectory)"
  state=${states[0]:-}
  local s
  for s in "${states[@]:-}"; do
    [[ $s == capstan/* ]] || say "StateDirectory=$s is not capstan/..."
  done
  local keys=()
  case $daemon in
    coordinator) keys=(CAPSTAN_WORK_DIR CAPSTAN_CHECKPOINT_DIR) ;;
    data-dispatcher) keys=(CAPSTAN_WORK_DIR) ;;
  esac
  local key dir
  local under
  for key in "${keys[@]}"; do
    dir=$(value "$file" Environment | sed -n "s/^$key=//p")
    under=0
    for s in "${states[@]:-}"; do
      [[ $dir == "%S/$s/"* ]] && under=1
    done
    ((under)) || say "Environment=$key=${dir:-(unset)} is not under a state directory of its unit (${states[*]:-none})"
  done
  return $((problems > 0))
}

# instance FILE: the unit name verify gets (a template through instance 0).
instance() {
  local name
  name=$(basename "$1")
  if [[ $name == *@.service ]]; then echo "${name%@.service}@0.service"; else echo "$name"; fi
}

# check_verify DIR FILE: systemd-analyze verify on DIR's copy of FILE, with
# ExecStart pointed at BIN_DIR (part 2). Prints the problems.
check_verify() {
  local dir=$1 name unit out rc line problems=0
  name=$(basename "$2")
  unit=$(instance "$2")
  sed -i "s#$prefix_bin/#$bin/#g" "$dir/$name"
  rc=0
  out=$(cd "$dir" && systemd-analyze verify "${verify_options[@]}" "$dir/$unit" 2>&1) || rc=$?
  while IFS= read -r line; do
    [[ -n $line ]] || continue
    if [[ $line == *"$dir"* || $line == *"${name%.service}"* || $line == *"${unit%.service}"* ||
          $line == *capstan* ]]; then
      echo "$unit: $line"
      problems=$((problems + 1))
    else
      echo "note ($unit, not about it): $line" >&2
    fi
  done <<< "$out"
  if [[ $rc != 0 ]]; then
    echo "$unit: systemd-analyze verify exited $rc"
    problems=$((problems + 1))
  fi
  return $((problems > 0))
}

# check_all DIR: both parts on every unit in DIR (edited in place). Output in
# $tmp/last.log.
check_all() {
  local dir=$1 file status=0
  : > "$tmp/last.log"
  shopt -s nullglob
  local files=("$dir"/*.service)
  shopt -u nullglob
  if [[ ${#files[@]} == 0 ]]; then
    echo "no units in $dir" >> "$tmp/last.log"
    return 1
  fi
  for file in "${files[@]}"; do
    check_layout "$file" >> "$tmp/last.log" || status=1
    check_verify "$dir" "$file" >> "$tmp/last.log" || status=1
  done
  return $status
}

count=$(find "$units_dir" -maxdepth 1 -name '*.service' | wc -l)
mkdir "$tmp/units"
cp "$units_dir"/*.service "$tmp/units/"
if check_all "$tmp/units"; then
  ok "deploy/systemd: $count units pass (systemd $(systemd-analyze --version | sed -n '1s/^systemd \([0-9]*\).*/\1/p'))"
else
  cat "$tmp/last.log"
  bad "deploy/systemd"
fi

# --- Self-check: broken copies must fail, for the reason broken ----------------
# expect_failure NAME PATTERN EDIT...: copies the units, runs EDIT in the
# copy, and requires the checks to fail with a line matching PATTERN.
expect_failure() {
  local name=$1 pattern=$2
  shift 2
  local copy=$tmp/broken-$name
  mkdir "$copy"
  chmod 755 "$copy"
  cp "$units_dir"/*.service "$copy/"
  (cd "$copy" && "$@")
  if check_all "$copy"; then
    cat "$tmp/last.log"
    bad "self-check '$name': the broken copy passed"
  elif ! grep -q -- "$pattern" "$tmp/last.log"; then
    cat "$tmp/last.log"
    bad "self-check '$name': failed, but not with /$pattern/"
  else
    ok "self-check '$name' fails: $(grep -m1 -- "$pattern" "$tmp/last.log")"
  fi
}

expect_failure unknown-key "Unknown key" \
  sed -i 's/^RestartSec=2$/RestartSec=2\nRestartSecs=3/' capstan-coordinator.service
expect_failure bad-value "Failed to parse" \
  sed -i 's/^Restart=on-failure$/Restart=sometimes/' capstan-ps-server@.service
expect_failure bad-section "Unknown section" \
  sed -i 's/^\[Install\]$/[Instal]/' capstan-data-worker@.service
expect_failure missing-binary "is not executable" \
  sed -i "s#$prefix_bin/worker-server#$prefix_bin/no-such-daemon#" capstan-worker-server@.service
expect_failure checkpoint-outside-state "CAPSTAN_CHECKPOINT_DIR=/srv" \
  sed -i 's#^Environment=CAPSTAN_CHECKPOINT_DIR=.*#Environment=CAPSTAN_CHECKPOINT_DIR=/srv/checkpoints#' \
    capstan-coordinator.service
expect_failure old-prefix "does not run $prefix_bin/data-dispatcher" \
  sed -i "s#$prefix_bin/data-dispatcher#/usr/local/bin/data-dispatcher#" capstan-data-dispatcher.service

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
