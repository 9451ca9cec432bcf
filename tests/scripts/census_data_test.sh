#!/usr/bin/env bash
# The census data shipped under examples/census/data decompresses to the
# files as published: their SHA-256 digests match SHA256SUMS, and, where
# ../shared/testdata/adult exists, the bytes match those copies.
#
# Usage: census_data_test.sh REPO_ROOT
set -euo pipefail

repo=$1
data=$repo/examples/census/data
shared=$repo/../shared/testdata/adult
failed=0
passed=0
check() {
  if "$@"; then passed=$((passed + 1)); else echo "FAIL: $*"; failed=$((failed + 1)); fi
}
digest_matches() {
  local name=$1 want got
  want=$(awk -v n="$name" '$2 == n {print $1}' "$data/SHA256SUMS")
  got=$(gzip -dc "$data/$name.gz" | sha256sum | cut -d' ' -f1)
  [[ -n $want && $want == "$got" ]] || { echo "$name: sha256 $got, SHA256SUMS says '$want'"; return 1; }
}
rows() {
  local name=$1 skip=$2 want=$3 got
  got=$(gzip -dc "$data/$name.gz" | tail -n +"$skip" | grep -c ',')
  [[ $got == "$want" ]] || { echo "$name: $got rows, want $want"; return 1; }
}
for name in adult.data adult.test adult.names; do
  check digest_matches "$name"
  if [[ -d $shared ]]; then
    check cmp <(gzip -dc "$data/$name.gz") "$shared/$name"
  fi
done
check rows adult.data 1 32561
check rows adult.test 2 16281
echo "$passed passed, $failed failed"
((failed == 0))
