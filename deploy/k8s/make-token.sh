#!/usr/bin/env bash
# Writes the cluster token for the Kubernetes manifests: 32 random bytes,
# base64 (44 characters), into deploy/k8s/token (or the file given), mode
# 0600. kustomization.yaml's secretGenerator makes the Secret capstan-token
# from it. The file is git-ignored: never commit a token.
#
# Usage: deploy/k8s/make-token.sh [--force] [FILE]
#   An existing token file is kept unless --force is given (a new token means
#   every pod restarts with it on the next `kubectl apply -k`).
set -euo pipefail

force=0
if [[ ${1:-} == --force ]]; then
  force=1
  shift
fi
out=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/token}

if [[ -s $out && $force == 0 ]]; then
  echo "make-token.sh: $out exists; kept (--force writes a new one)"
  exit 0
fi

umask 077
tmp=$(mktemp "$out.XXXXXX")
trap 'rm -f "$tmp"' EXIT
# No trailing newline: the file's bytes are the token.
printf '%s' "$(head -c 32 /dev/urandom | base64 | tr -d '\n')" > "$tmp"
mv "$tmp" "$out"
trap - EXIT
echo "make-token.sh: wrote a new token to $out"
