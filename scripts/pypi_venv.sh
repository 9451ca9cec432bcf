# Sourced by the scripts that need a package from PyPI in a virtual
# environment of their own (the tensorboard and Kubernetes-manifest tests,
# bench/peers/venv.sh):
#   . "$REPO/scripts/pypi_venv.sh"
#   make_pypi_venv VENV LOG PACKAGE...
# makes VENV and pip-installs PACKAGE... into it, writing pip's output to
# LOG. A package index is a remote service: a try that fails (a dropped
# connection, an index answering 5xx) is retried twice, 10 s and then 30 s
# later, before the test gives up. Returns non-zero, VENV removed, when every
# try failed; LOG then holds the last try's output.
make_pypi_venv() {
  local venv=$1 log=$2
  shift 2
  local delay
  for delay in 10 30 ""; do
    rm -rf "$venv"
    if python3 -m venv "$venv" >"$log" 2>&1 &&
       "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
         --retries 10 --timeout 60 "$@" >>"$log" 2>&1; then
      return 0
    fi
    [[ -z $delay ]] && break
    echo "pip install $* failed (last lines below); trying again in $delay s"
    tail -n 5 "$log"
    sleep "$delay"
  done
  rm -rf "$venv"
  return 1
}
