#!/usr/bin/env bash
# Compiles every Capstan source file with clang's thread-safety analysis
# (-Wthread-safety, as errors), syntax only, with the flags CMake uses for it.
# Mutex-held fields are annotated (GUARDED_BY, see lib/sync/mutex.h); this is
# what checks the annotations. scripts/test.sh runs it after the build.
#
# Usage: scripts/check-thread-safety.sh [BUILD_DIR]   (default: build)
#   CAPSTAN_JOBS  parallel clang processes (default: 2)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
build_dir=${1:-${CAPSTAN_BUILD_DIR:-build}}
jobs=${CAPSTAN_JOBS:-2}
clang=${CAPSTAN_CLANG:-clang++}

if ! command -v "$clang" > /dev/null; then
  echo "check-thread-safety.sh: $clang not found; scripts/setup.sh installs clang" >&2
  exit 1
fi
db=$build_dir/compile_commands.json
if [[ ! -f $db ]]; then
  echo "check-thread-safety.sh: $db not found; run scripts/build.sh first" >&2
  exit 1
fi

commands=$(mktemp)
locking=$(mktemp)
out=$(mktemp -d)
trap 'rm -rf "$commands" "$locking" "$out"' EXIT

# Only translation units that include lib/sync/mutex.h can hold annotated
# code (the annotations and the annotated Mutex come from there; libstdc++'s
# mutexes carry none), so only those are checked. Ninja's dependency log says
# which they are; without it every file is checked.
if [[ -f $build_dir/.ninja_deps ]] && command -v ninja > /dev/null; then
  ninja -C "$build_dir" -t deps 2> /dev/null |
    awk '/^[^ \t].*: #deps/ { sub(/: #deps.*/, ""); object = $0 } /lib\/sync\/mutex\.h$/ { print object }' |
    sort -u > "$locking"
fi

# One clang command per Capstan source file (generated code and files under
# the build directory are not ours). GCC's warning flags are dropped; only the
# thread-safety warnings are turned on, as errors. With ccache, each file is
# compiled at -O0 into a throwaway object through it, so a file whose
# sources have not changed since a passing check (in any clone: paths are
# keyed relative to the checkout) is not analysed again; without it, syntax
# only.
launcher=
if command -v ccache > /dev/null; then
  launcher=ccache
  export CCACHE_BASEDIR=$repo CCACHE_NOHASHDIR=true
fi
python3 - "$db" "$repo" "$clang" "$out" "$locking" "$launcher" > "$commands" <<'PY'
import json, os, shlex, sys
db, repo, clang, out, locking_file, launcher = sys.argv[1:]
repo = os.path.realpath(repo)
locking = set(line.strip() for line in open(locking_file) if line.strip())
seen = set()
for i, entry in enumerate(json.load(open(db))):
    src = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
    if not src.startswith(repo + "/") or "/build" in src[len(repo):] or src.endswith((".pb.cc", ".capnp.c++")):
        continue
    args = shlex.split(entry["command"]) if "command" in entry else entry["arguments"]
    output = entry.get("output") or (args[args.index("-o") + 1] if "-o" in args[:-1] else None)
    if locking and output not in locking:
        continue
    if src in seen:
        continue
    seen.add(src)
    kept, skip = ([launcher] if launcher else []) + [clang], False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a.startswith("-W") or a == "-w" or a.startswith("-fsanitize"):
            continue
        if launcher and (a.startswith("-O") or a.startswith("-g")):
            continue
        kept.append(a)
    if launcher:
        kept += ["-c", "-O0", "-g0", "-o", os.path.join(out, "%04d.o" % i)]
    else:
        kept += ["-fsyntax-only"]
    kept += ["-Wno-unknown-warning-option", "-Wthread-safety", "-Werror=thread-safety"]
    log = os.path.join(out, "%04d.log" % i)
    print("cd %s && { %s > %s 2>&1 || { echo FAILED: %s >> %s; }; rm -f %s; }" % (
        shlex.quote(entry["directory"]), " ".join(shlex.quote(a) for a in kept),
        shlex.quote(log), shlex.quote(os.path.relpath(src, repo)), shlex.quote(log),
        shlex.quote(os.path.join(out, "%04d.o" % i))))
PY

total=$(wc -l < "$commands")
if (( total == 0 )); then
  echo "check-thread-safety.sh: no source files to check in $db" >&2
  exit 1
fi
started=$SECONDS
tr '\n' '\0' < "$commands" | xargs -0 -P "$jobs" -I{} bash -c '{}'
failed=$(cat "$out"/*.log 2>/dev/null | grep -c '^FAILED: ' || true)
if (( failed > 0 )); then
  cat "$out"/*.log | grep -E 'error:|^FAILED: ' | sort -u
  echo "check-thread-safety.sh: $failed of $total files fail clang's -Wthread-safety" >&2
  exit 1
fi
echo "check-thread-safety.sh: $total files pass clang's -Wthread-safety ($(( SECONDS - started ))s)"
