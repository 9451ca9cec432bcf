# Sourced by the scripts that need a package from PyPI in a virtual
# environment of their own (the tensorboard, safetensors and Kubernetes-manifest tests,
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

# A test's Python interpreter that imports MODULES (comma-separated, as
# `import` takes them): OVERRIDE when set (a machine without a package
# index), else BUILD/NAME-venv, made once with `pip install PACKAGE...`
# (under a lock: ctest -j runs tests at once). Prints the interpreter's
# path; on failure prints why on stderr and returns 1.
#   python=$(pypi_test_python "$build_dir" tensorboard tensorboard \
#              "${CAPSTAN_TENSORBOARD_PYTHON:-}" CAPSTAN_TENSORBOARD_PYTHON tensorboard) || fail ...
pypi_test_python() {
  local build=$1 name=$2 modules=$3 override=$4 override_name=$5
  shift 5
  local python=$override
  if [[ -z $python ]]; then
    local venv=$build/$name-venv
    python=$venv/bin/python
    (
      flock 9
      if ! "$python" -c "import $modules" 2>/dev/null; then
        echo "making $venv (pip install $*; once)" >&2
        if ! make_pypi_venv "$venv" "$build/$name-venv.log" "$@" >&2; then
          tail -n 20 "$build/$name-venv.log" >&2
          echo "making $venv with $* failed three times (log above; Debian needs" \
            "python3-venv); without a package index, set $override_name to a" \
            "python that has $*" >&2
          exit 1
        fi
      fi
    ) 9>"$build/$name-venv.lock" || return 1
  fi
  if ! "$python" -c "import $modules"; then
    echo "$python cannot import $modules" >&2
    return 1
  fi
  echo "$python"
}
