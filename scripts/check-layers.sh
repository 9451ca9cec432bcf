#!/usr/bin/env bash
# Checks that every #include "..." in lib/, sdk/src/, daemons/ and tools/
# points down the layers (or within its own module), never up, and never
# sideways between the subsystems of the middle layer. Prints each offending
# file and include and exits 1; exits 0 when the tree is clean.
#
# The layers, lowest first:
#   0 ground       lib/sync lib/io lib/async lib/types lib/cuda_info.*,
#                  and the public headers sdk/include/capstan/ (the value
#                  types and declarations every layer may use)
#   1 rpc          lib/rpc lib/wire_names.* and the schemas (capstan_schemas/)
#   2 subsystems   lib/journal lib/checkpoint lib/placement lib/collectives
#                  lib/data: each may use the layers below, not one another
#                  (except the pairs in ALLOWED_SIDEWAYS)
#   3 training     lib/training
#   4 sdk          sdk/src (the public API's implementation)
#   5 programs     daemons/ tools/
# Tests sit with their module and obey its layer.
#
# Usage: scripts/check-layers.sh [repository root]   (default: this script's ..)
set -euo pipefail

root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$root"

# "from:to" module pairs of the middle layer allowed to meet. Each is a debt:
# checkpoint reads tensors with data's tensor utilities.
ALLOWED_SIDEWAYS=("checkpoint:data")

layer_names=(ground rpc subsystems training sdk programs)

# Prints "<layer> <module>" for a path relative to the root, or nothing for
# a path outside the layered tree.
classify() {
  local path="$1"
  case "$path" in
    lib/sync/*) echo "0 sync" ;;
    lib/io/*) echo "0 io" ;;
    lib/async/*) echo "0 async" ;;
    lib/types/*) echo "0 types" ;;
    lib/cuda_info.*) echo "0 cuda_info" ;;
    sdk/include/*) echo "0 public" ;;
    lib/rpc/*) echo "1 rpc" ;;
    lib/wire_names.*) echo "1 rpc" ;;
    schemas/*) echo "1 schemas" ;;
    lib/journal/*) echo "2 journal" ;;
    lib/checkpoint/*) echo "2 checkpoint" ;;
    lib/placement/*) echo "2 placement" ;;
    lib/collectives/*) echo "2 collectives" ;;
    lib/data/*) echo "2 data" ;;
    lib/training/*) echo "3 training" ;;
    sdk/src/*) echo "4 sdk" ;;
    daemons/*) echo "5 daemons" ;;
    tools/*) echo "5 tools" ;;
    *) ;;
  esac
}

# The file an include names, relative to the root, as the build's include
# path finds it; nothing for headers outside the tree (generated, system).
resolve() {
  local includer="$1" name="$2"
  case "$name" in
    capstan/*) echo "sdk/include/$name"; return ;;
    capstan_schemas/*) echo "schemas/${name#capstan_schemas/}"; return ;;
    daemons/* | tools/*) echo "$name"; return ;;
  esac
  local here
  here="$(dirname "$includer")"
  if [[ -f "$here/$name" ]]; then
    echo "$here/$name"
  elif [[ -f "lib/$name" ]]; then
    echo "lib/$name"
  elif [[ "$includer" == sdk/src/* && -f "sdk/src/$name" ]]; then
    echo "sdk/src/$name"
  fi
}

sideways_allowed() {
  local pair="$1:$2" allowed
  for allowed in "${ALLOWED_SIDEWAYS[@]}"; do
    [[ "$allowed" == "$pair" ]] && return 0
  done
  return 1
}

failures=0
while IFS= read -r file; do
  from="$(classify "$file")"
  [[ -n "$from" ]] || continue
  from_layer="${from%% *}"
  from_module="${from#* }"
  while IFS= read -r line; do
    number="${line%%:*}"
    name="$(sed -E 's/^[0-9]+:[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/' <<<"$line")"
    target="$(resolve "$file" "$name")"
    [[ -n "$target" ]] || continue
    to="$(classify "$target")"
    [[ -n "$to" ]] || continue
    to_layer="${to%% *}"
    to_module="${to#* }"
    why=""
    if ((to_layer > from_layer)); then
      why="points up: ${layer_names[$from_layer]} ($from_module) -> ${layer_names[$to_layer]} ($to_module)"
    elif ((to_layer == from_layer && from_layer == 2)) && [[ "$to_module" != "$from_module" ]] &&
        ! sideways_allowed "$from_module" "$to_module"; then
      why="points sideways: $from_module -> $to_module (both ${layer_names[$from_layer]})"
    fi
    if [[ -n "$why" ]]; then
      echo "$file:$number: #include \"$name\" $why"
      failures=$((failures + 1))
    fi
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$file" || true)
done < <(find lib sdk/src sdk/include daemons tools -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cpp' \) | sort)

if ((failures > 0)); then
  echo "check-layers: $failures include(s) break the layering (see the layers at the top of $0)." >&2
  echo "Move the shared type down, or the code that needs both up." >&2
  exit 1
fi
echo "check-layers: every include points down or within its module"
