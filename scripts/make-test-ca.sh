#!/usr/bin/env bash
# Makes a test certificate authority and certificates for Capstan's TLS, for
# tests and local clusters (not for production: keys are unencrypted).
#
# Usage: scripts/make-test-ca.sh DIR [HOST...]
#   DIR/ca.pem, ca.key          the CA (give ca.pem as tls_ca / CAPSTAN_TLS_CA)
#   DIR/server.pem, server.key  a daemon certificate for 127.0.0.1, localhost
#                               and each HOST (IP addresses or DNS names). An
#                               IP address goes in twice, as IP and as DNS
#                               name: KJ's TLS checks the name clients dial
#                               as a DNS name.
#   DIR/client.pem, client.key  a client certificate (mutual TLS)
set -euo pipefail

dir=${1:?usage: make-test-ca.sh DIR [HOST...]}
shift
mkdir -p "$dir"
cd "$dir"

sans="IP:127.0.0.1,DNS:127.0.0.1,DNS:localhost"
for host in "$@"; do
  if [[ $host =~ ^[0-9.]+$ || $host == *:* ]]; then sans+=",IP:$host,DNS:$host"; else sans+=",DNS:$host"; fi
done

quiet() { "$@" >/dev/null 2>&1 || { echo "make-test-ca: failed: $*" >&2; "$@"; exit 1; }; }

quiet openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
  -subj "/CN=Capstan test CA" -keyout ca.key -out ca.pem \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"

issue() {  # name, subject, extended key usage, [subjectAltName]
  local name=$1 subject=$2 usage=$3 san=${4:-}
  quiet openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$subject" \
    -keyout "$name.key" -out "$name.csr"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    [[ -n $san ]] && echo "subjectAltName=$san"
  } >"$name.ext"
  quiet openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile "$name.ext" -out "$name.pem"
  rm -f "$name.csr" "$name.ext"
}

issue server "/CN=capstan-daemon" "serverAuth,clientAuth" "$sans"
issue client "/CN=capstan-client" "clientAuth"
chmod 600 ./*.key
echo "make-test-ca: wrote $(pwd)/{ca,server,client}.{pem,key} (server names: $sans)"
