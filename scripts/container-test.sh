#!/usr/bin/env bash
# The container test: builds the Capstan image and runs the compose cluster
# (deploy/docker/docker-compose.yml) end to end: 2 parameter servers, the
# coordinator, 2 workers, the data dispatcher, 2 data workers and the census
# job, which must reach its targets (exit 0). scripts/test.sh runs it.
#
#   1. dockerd: used if it answers; otherwise started here
#      (dockerd --bridge=none --iptables=false, as this machine allows) and
#      stopped at the end;
#   2. debian:12: when Docker lacks it and no registry is reachable, made
#      with `debootstrap --variant=minbase bookworm` and `docker import`;
#   3. the image: the Dockerfile's base stage (runtime libraries, user,
#      health check), then Dockerfile.prebuilt with this checkout's build
#      installed into it (cmake --install --strip), tagged capstan:local;
#   4. `docker-compose up --exit-code-from census` (the compose file uses
#      host networking): the job's output is shown as it trains;
#      the test checks the exit status, the final metrics line and that every
#      daemon container was healthy, then takes the cluster down.
#
# Usage: scripts/container-test.sh        (root, or a user in group docker)
#   CAPSTAN_BUILD_DIR  the build to pack (default: build; built if missing)
#   CAPSTAN_CONTAINER_TIMEOUT  seconds the compose run may take (default 900)
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
build_dir=${CAPSTAN_BUILD_DIR:-build}
timeout_s=${CAPSTAN_CONTAINER_TIMEOUT:-900}
work=$(mktemp -d /tmp/capstan-container-test.XXXXXX)
project=capstan-test-$$
compose_files=(-f deploy/docker/docker-compose.yml)
started_dockerd=0

say() { printf 'container-test: %s\n' "$*"; }
fail() { say "FAILED: $*" >&2; exit 1; }

compose() {
  if docker compose version >/dev/null 2>&1; then
    docker compose -p "$project" "${compose_files[@]}" "$@"
  else
    docker-compose -p "$project" "${compose_files[@]}" "$@"
  fi
}

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [[ -f "$work/compose-started" ]]; then
    compose down -v --remove-orphans >"$work/down.log" 2>&1 || say "compose down failed; see $work/down.log"
  fi
  if [[ $started_dockerd == 1 ]]; then
    kill "$(cat "$work/dockerd.pid")" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$(cat "$work/dockerd.pid")" 2>/dev/null || break; sleep 0.2; done
  fi
  if [[ $status == 0 ]]; then rm -rf "$work"; else say "logs kept in $work"; fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- 1. dockerd ---------------------------------------------------------------
command -v docker >/dev/null || fail "docker is not installed (scripts/setup.sh --test installs docker.io)"
command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 ||
  fail "neither 'docker compose' nor docker-compose is installed (scripts/setup.sh --test installs docker-compose)"
if ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null || fail "no Docker daemon answers and dockerd is not installed"
  say "starting dockerd (--bridge=none --iptables=false; log: $work/dockerd.log)"
  setsid dockerd --bridge=none --iptables=false >"$work/dockerd.log" 2>&1 &
  echo $! >"$work/dockerd.pid"
  started_dockerd=1
  for _ in $(seq 150); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
  docker info >/dev/null 2>&1 || fail "dockerd did not start; see $work/dockerd.log"
fi

# --- 2. debian:12 -------------------------------------------------------------
if ! docker image inspect debian:12 >/dev/null 2>&1 && ! docker pull -q debian:12 >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || fail "debian:12 is missing and debootstrap is not installed"
  say "making debian:12 with debootstrap --variant=minbase bookworm (a few minutes)"
  mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
  debootstrap --variant=minbase bookworm "$work/rootfs" "${mirror:-http://deb.debian.org/debian}" \
    >"$work/debootstrap.log" 2>&1 || fail "debootstrap failed; see $work/debootstrap.log"
  tar -C "$work/rootfs" -c . | docker import - debian:12 >/dev/null
  rm -rf "$work/rootfs"
fi

# --- 3. the image ---------------------------------------------------------------
[[ -x "$build_dir/bin/coordinator" && -x "$build_dir/bin/census" ]] || bash scripts/build.sh
cmake --build "$build_dir" -j "${CAPSTAN_JOBS:-2}" >/dev/null
say "building capstan-base:local (deploy/docker/Dockerfile, stage base)"
docker build -q --network host --target base -t capstan-base:local -f deploy/docker/Dockerfile . \
  >"$work/build-base.log" 2>&1 || { cat "$work/build-base.log" >&2; fail "building the base stage"; }
cmake --install "$build_dir" --prefix "$work/context/capstan" --strip >/dev/null
say "building capstan:local (deploy/docker/Dockerfile.prebuilt, $(du -sh "$work/context" | cut -f1) installed)"
docker build -q -t capstan:local -f deploy/docker/Dockerfile.prebuilt "$work/context" \
  >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; fail "building the image"; }
rm -rf "$work/context"
docker images capstan

# Every executable starts in the image (its shared libraries are there).
for program in coordinator ps-server worker-server data-dispatcher data-worker capstanctl evaluator \
               census ctr linear_regression; do
  docker run --rm --network host capstan:local "$program" --help >/dev/null 2>"$work/help.log" ||
    { cat "$work/help.log" >&2; fail "'$program --help' does not run in the image"; }
done

# --- 4. the compose cluster -------------------------------------------------
for port in 7000 7100 7101 7200 7201 7300 7400 7401 8000 8100 8101 8200 8201 8300 8400 8401; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    fail "port $port is in use on this host; the compose cluster (host networking) needs it"
  fi
done
say "docker-compose up --exit-code-from census (the cluster trains the census model)"
touch "$work/compose-started"
status=0
CAPSTAN_TOKEN=$(head -c 18 /dev/urandom | base64) timeout "$timeout_s" \
  bash -c "$(declare -f compose); project=$project; compose_files=(${compose_files[*]}); \
           compose up --no-build --no-color --exit-code-from census" 2>&1 | tee "$work/up.log" || status=$?
[[ $status == 0 ]] || fail "the compose run exited with $status (124: over ${timeout_s} s); see $work/up.log"
grep -Eq 'census.*\| +accuracy .*target.*PASS' "$work/up.log" && grep -Eq 'census.*\| +AUC .*target.*PASS' "$work/up.log" ||
  fail "the census job did not print its final metrics with both targets met; see $work/up.log"
for service in ps0 ps1 coordinator worker0 worker1 data-dispatcher data-worker0 data-worker1; do
  grep -Eq "^${service}(_|-)1 +\|.*listening" "$work/up.log" ||
    fail "$service never logged that it was listening; see $work/up.log"
done
# Peers dial what each daemon advertises: its service name (advertise_address),
# not the container's host name.
grep -q 'data worker data-worker0:7400 registered' "$work/up.log" ||
  fail "the dispatcher did not see data-worker0 at its advertised address data-worker0:7400; see $work/up.log"
say "passed: the compose cluster trained the census model to its targets"
