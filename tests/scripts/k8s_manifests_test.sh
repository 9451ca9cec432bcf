#!/usr/bin/env bash
# Checks the Kubernetes manifests in deploy/k8s without a cluster:
#
#   1. schema: every document of every manifest validates, strictly (unknown
#      fields are errors), against the Kubernetes JSON schemas of every
#      version from 1.28 (the first with the pod-index label the PS and data
#      workers take their task index from) to the newest the validator
#      bundles. The validator is the PyPI package kubernetes-validate,
#      installed once into a virtual environment under WORK_DIR;
#   2. kustomization.yaml lists every manifest file, and only existing ones;
#   3. no literal token: no Secret with data in a manifest, no CAPSTAN_TOKEN
#      value, no secretGenerator literals, no "change-me", and the token file
#      make-token.sh writes is git-ignored and untracked;
#   4. the deployment rules of deploy/README.md: every container has CPU and
#      memory requests and a memory limit, sets --buffer-cache-mib to at most
#      half that limit, reads the token with --token-file from the generated Secret,
#      probes /healthz (liveness) and /readyz (readiness), runs as non-root;
#      every workload has a PodDisruptionBudget; the coordinator and the
#      dispatcher keep work_dir (and checkpoint_dir) on a volume claim; the
#      coordinator's --ps-service names the PS StatefulSet's headless Service
#      and --num-ps equals its replicas; advertise addresses come from the
#      downward API;
#   5. deploy/k8s/make-token.sh writes a random token (mode 0600) and keeps
#      it; where kubectl or kustomize is installed, the kustomization renders
#      with it, every pod mounts the generated Secret, and the rendered
#      documents validate as well (not rendered, with a note, elsewhere).
#
# Then it checks itself: copies of the manifests broken on purpose (a bad
# field type, an unknown field, a missing kustomization entry, a literal
# token, a wrong --num-ps, a missing limit) must each fail.
#
# Usage: k8s_manifests_test.sh REPO_ROOT WORK_DIR
#   WORK_DIR holds the validator's virtual environment (k8s-validate-venv/),
#   reused by later runs. CAPSTAN_K8S_VALIDATE_VENV names another one.
#   Fails (exit 1) when the validator can be neither found nor installed
#   (no network), as when any check fails: nothing is skipped.
set -euo pipefail

repo=$(cd "$1" && pwd)
work=$2
manifests=$repo/deploy/k8s
. "$(dirname "$0")/../../scripts/pypi_venv.sh"
venv=${CAPSTAN_K8S_VALIDATE_VENV:-$work/k8s-validate-venv}
# Pinned, so that every run validates against the same schemas. A newer
# release bundles newer Kubernetes versions: bump it here.
validator_package=kubernetes-validate==1.37.0

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }

# --- The validator -----------------------------------------------------------
if ! "$venv/bin/python" -c 'import kubernetes_validate, yaml' 2>/dev/null; then
  echo "installing $validator_package into $venv"
  mkdir -p "$(dirname "$venv")"
  if ! make_pypi_venv "$venv" "$tmp/pip.log" "$validator_package"; then
    cat "$tmp/pip.log"
    echo "FAIL: cannot install $validator_package from PyPI in three tries (no network?); the manifests were not validated"
    exit 1
  fi
fi
python=$venv/bin/python
validate=$venv/bin/kubernetes-validate
[[ -x $validate ]] || { echo "FAIL: $validate missing"; exit 1; }

# Kubernetes versions: 1.28 up to the newest bundled.
mapfile -t versions < <("$python" - <<'EOF'
import kubernetes_validate.utils as u
from packaging.version import Version
for v in sorted(set(u.all_versions()), key=Version):
    if Version(v) >= Version("1.28.0"):
        print(v)
EOF
)
if [[ ${#versions[@]} -lt 2 || ${versions[0]} != 1.28.0 ]]; then
  echo "FAIL: the validator bundles no schemas from 1.28.0 on (got: ${versions[*]:-none})"
  exit 1
fi
echo "Kubernetes versions: ${versions[*]}"

# --- The checks, on a directory of manifests -----------------------------------
cat > "$tmp/check.py" <<'EOF'
"""Checks a directory of Kubernetes manifests (see k8s_manifests_test.sh)."""
import os
import re
import subprocess
import sys

import yaml

directory, validate, repo = sys.argv[1], sys.argv[2], sys.argv[3]
versions = sys.argv[4:]
problems = []


def problem(where, what):
    problems.append(f"{where}: {what}")


def quantity(text):
    """Bytes of a Kubernetes memory quantity (Mi, Gi, M, G, plain)."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    if not match or (match.group(2) and match.group(2) not in units):
        return None
    return float(match.group(1)) * units.get(match.group(2), 1)


files = sorted(f for f in os.listdir(directory)
               if f.endswith((".yaml", ".yml")) and f != "kustomization.yaml")
documents = []  # (file, document)
counts = {}  # file -> documents, for the files that parse
for name in files:
    path = os.path.join(directory, name)
    try:
        with open(path) as stream:
            docs = [d for d in yaml.safe_load_all(stream) if d is not None]
    except yaml.YAMLError as error:
        problem(name, f"not YAML: {error}")
        continue
    if not docs:
        problem(name, "no documents")
    documents += [(name, d) for d in docs]
    counts[name] = len(docs)

# 1. Schemas: strict, every version; each document must pass in each. One
#    validator run for all files (each version's schemas load once).
if counts:
    paths = {os.path.join(directory, name): name for name in counts}
    run = subprocess.run([validate, "--strict"] + [a for v in versions for a in ("-k", v)] + list(paths),
                         capture_output=True, text=True)
    passes = dict.fromkeys(counts, 0)
    others = []
    for line in (run.stdout + run.stderr).splitlines():
        fields = line.split()
        if line.startswith("INFO ") and " passed for resource " in line and len(fields) > 1 and fields[1] in paths:
            passes[paths[fields[1]]] += 1
        else:
            others.append(line)
    for line in others:
        where = next((name for path, name in paths.items() if path in line), "manifests")
        problem(where, f"schema: {line}")
    if run.returncode != 0 and not others:
        problem("manifests", f"schema: kubernetes-validate exited {run.returncode}")
    for name, docs in counts.items():
        if passes[name] != docs * len(versions):
            problem(name, f"schema: {passes[name]} documents passed, want {docs} x {len(versions)} versions")

# 2. kustomization.yaml lists every manifest, and only files that exist.
kustomization_path = os.path.join(directory, "kustomization.yaml")
kustomization = {}
try:
    with open(kustomization_path) as stream:
        kustomization = yaml.safe_load(stream) or {}
except (OSError, yaml.YAMLError) as error:
    problem("kustomization.yaml", f"unreadable: {error}")
listed = kustomization.get("resources") or []
for name in files:
    if name not in listed:
        problem("kustomization.yaml", f"resources does not list {name}")
for name in listed:
    if not os.path.exists(os.path.join(directory, name)):
        problem("kustomization.yaml", f"resources lists {name}, which does not exist")

# 3. No literal token anywhere.
for name in files + ["kustomization.yaml"]:
    with open(os.path.join(directory, name)) as stream:
        if "change-me" in stream.read().lower():
            problem(name, "holds the placeholder token 'change-me'")
for name, doc in documents:
    if doc.get("kind") == "Secret" and (doc.get("data") or doc.get("stringData")):
        problem(name, f"Secret {doc['metadata'].get('name')} holds literal data")
generators = kustomization.get("secretGenerator") or []
for generator in generators:
    if generator.get("literals") or generator.get("envs") or generator.get("env"):
        problem("kustomization.yaml", f"secretGenerator {generator.get('name')} takes literal values")
token_generators = [g for g in generators if g.get("name") == "capstan-token"]
if not token_generators:
    problem("kustomization.yaml", "no secretGenerator for capstan-token")
for generator in token_generators:
    for entry in generator.get("files") or []:
        source = entry.split("=", 1)[-1]
        relative = os.path.relpath(os.path.join(directory, source), repo)
        if relative.startswith(".."):
            continue
        if os.path.isdir(os.path.join(repo, ".git")):
            ignored = subprocess.run(["git", "-C", repo, "check-ignore", "-q", "--no-index", relative])
            if ignored.returncode != 0:
                problem(".gitignore", f"the token file {relative} is not git-ignored")
            tracked = subprocess.run(["git", "-C", repo, "ls-files", "--", relative],
                                     capture_output=True, text=True)
            if tracked.stdout.strip():
                problem(relative, "the token file is tracked by git")

# 4. The deployment rules.
workloads = [(n, d) for n, d in documents if d.get("kind") in ("StatefulSet", "Deployment")]
services = {d["metadata"]["name"]: d for n, d in documents if d.get("kind") == "Service"}
budgets = [d for n, d in documents if d.get("kind") == "PodDisruptionBudget"]
statefulsets = {d["metadata"]["name"]: d for n, d in workloads if d["kind"] == "StatefulSet"}
components = set()
for name, doc in workloads:
    where = f"{name}: {doc['kind']} {doc['metadata']['name']}"
    spec = doc["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"].get("labels", {})
    component = labels.get("app.kubernetes.io/component")
    components.add(component)
    if not (pod.get("securityContext") or {}).get("runAsNonRoot"):
        problem(where, "pod securityContext lacks runAsNonRoot: true")
    if not any(set(b["spec"]["selector"].get("matchLabels", {}).items()) <= set(labels.items())
               for b in budgets):
        problem(where, "no PodDisruptionBudget selects its pods")
    secret_volumes = {v["name"] for v in pod.get("volumes") or []
                      if (v.get("secret") or {}).get("secretName") == "capstan-token"}
    claims = {c["metadata"]["name"]: c for c in spec.get("volumeClaimTemplates") or []}
    # Volumes of a standalone claim (the checkpoints the parameter servers
    # share) keep state as well.
    shared = {v["name"] for v in pod.get("volumes") or [] if "persistentVolumeClaim" in v}
    for container in pod["containers"]:
        cwhere = f"{where} container {container['name']}"
        args = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
        flags = {}
        for arg in args:
            if arg.startswith("--") and "=" in arg:
                key, value = arg[2:].split("=", 1)
                flags[key] = value
        resources = container.get("resources") or {}
        requests = resources.get("requests") or {}
        limits = resources.get("limits") or {}
        for key in ("cpu", "memory"):
            if key not in requests:
                problem(cwhere, f"no {key} request")
        if "memory" not in limits:
            problem(cwhere, "no memory limit")
        cache = flags.get("buffer-cache-mib")
        if cache is None:
            problem(cwhere, "does not set --buffer-cache-mib=N (the default, 1024 MiB, must fit the limit)")
        elif "memory" in limits:
            limit = quantity(limits["memory"])
            if limit is None:
                problem(cwhere, f"memory limit {limits['memory']!r} is not a quantity")
            elif int(cache) * 2**20 * 2 > limit:
                problem(cwhere, f"--buffer-cache-mib={cache} is more than half the memory limit {limits['memory']}")
        if flags.get("token-file") is None:
            problem(cwhere, "does not pass --token-file")
        else:
            mounted = [m for m in container.get("volumeMounts") or [] if m["name"] in secret_volumes]
            if not any(flags["token-file"].startswith(m["mountPath"].rstrip("/") + "/") for m in mounted):
                problem(cwhere, "--token-file is not under a mount of the capstan-token Secret")
        for env in container.get("env") or []:
            if env["name"] == "CAPSTAN_TOKEN":
                problem(cwhere, "sets CAPSTAN_TOKEN (mount the Secret and pass --token-file)")
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            got = ((container.get(probe) or {}).get("httpGet") or {}).get("path")
            if got != path:
                problem(cwhere, f"{probe} probes {got!r}, want {path}")
        if (container.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False:
            problem(cwhere, "securityContext lacks allowPrivilegeEscalation: false")
        advertise = flags.get("advertise-address", "")
        if "$(" not in advertise:
            problem(cwhere, "--advertise-address is not taken from the downward API ($(POD_...))")
        defined = {e["name"] for e in container.get("env") or []}
        for variable in re.findall(r"\$\(([A-Z_][A-Z0-9_]*)\)", " ".join(args)):
            if variable not in defined:
                problem(cwhere, f"$({variable}) is not defined in env")
        # State that must survive the pod: on a volume claim of the StatefulSet.
        if component in ("coordinator", "data-dispatcher"):
            needed = ["work-dir"] + (["checkpoint-dir"] if component == "coordinator" else [])
            for key in needed:
                value = flags.get(key)
                mounts = [m for m in container.get("volumeMounts") or [] if m["name"] in claims or m["name"] in shared]
                if doc["kind"] != "StatefulSet" or not claims:
                    problem(cwhere, "keeps state: must be a StatefulSet with volumeClaimTemplates")
                elif value is None:
                    problem(cwhere, f"does not set --{key}")
                elif not any(value.startswith(m["mountPath"].rstrip("/") + "/") for m in mounts):
                    problem(cwhere, f"--{key}={value} is not on a volume claim")
        if component == "coordinator":
            service = flags.get("ps-service", "")
            match = re.fullmatch(r"([a-z0-9-]+)(\.[^:]*)?:([0-9]+)", service)
            if not match:
                problem(cwhere, f"--ps-service={service!r} is not NAME[.NAMESPACE.svc...]:PORT")
            else:
                ps = statefulsets.get(match.group(1))
                if ps is None or ps["spec"].get("serviceName") != match.group(1):
                    problem(cwhere, f"--ps-service: no StatefulSet {match.group(1)} governed by a Service of that name")
                else:
                    if str(ps["spec"].get("replicas", 1)) != flags.get("num-ps"):
                        problem(cwhere, f"--num-ps={flags.get('num-ps')} but StatefulSet {match.group(1)} has "
                                        f"{ps['spec'].get('replicas', 1)} replicas")
                    if services.get(match.group(1), {}).get("spec", {}).get("clusterIP") != "None":
                        problem(cwhere, f"--ps-service: Service {match.group(1)} is not headless")
            if "ps" in flags:
                problem(cwhere, "lists the parameter servers literally (--ps); use --ps-service")
for component in ("ps", "coordinator", "data-dispatcher"):
    if component not in components:
        problem("manifests", f"no workload for {component}")

for line in problems:
    print(line)
print(f"{len(documents)} documents in {len(files)} files; {len(problems)} problems")
sys.exit(1 if problems else 0)
EOF

# check_dir DIR [VERSION...]: 0 when the manifests in DIR pass every check,
# their schemas those of VERSIONs (default: every version). Output in
# $tmp/last.log.
check_dir() {
  local dir=$1
  shift
  local against=("$@")
  [[ ${#against[@]} -gt 0 ]] || against=("${versions[@]}")
  "$python" "$tmp/check.py" "$dir" "$validate" "$repo" "${against[@]}" > "$tmp/last.log" 2>&1
}

if check_dir "$manifests"; then
  ok "deploy/k8s passes: $(tail -n 1 "$tmp/last.log")"
else
  cat "$tmp/last.log"
  bad "deploy/k8s"
fi

# --- make-token.sh, and the rendered kustomization -------------------------------
# make-token.sh writes a fresh random token, mode 0600, and keeps it on a second
# run. Where kubectl (or kustomize) exists, the kustomization renders with that
# token, every pod's Secret reference points at the generated (hashed) Secret,
# and the rendered documents validate too.
render=$tmp/render
cp -r "$manifests" "$render"
rm -f "$render/token"
bash "$manifests/make-token.sh" "$render/token" > /dev/null
first=$(cat "$render/token")
bash "$manifests/make-token.sh" "$render/token" > /dev/null
bash "$manifests/make-token.sh" /dev/null/none 2> /dev/null && bad "make-token.sh: no error on an unwritable path"
if [[ ${#first} == 44 && $(cat "$render/token") == "$first" && $(stat -c %a "$render/token") == 600 ]] &&
   bash "$manifests/make-token.sh" --force "$render/token" > /dev/null && [[ $(cat "$render/token") != "$first" ]]; then
  ok "make-token.sh writes a 44-character token, mode 0600, keeps it, replaces it with --force"
else
  bad "make-token.sh (token '${first:0:4}...', ${#first} characters, mode $(stat -c %a "$render/token"))"
fi
kustomize=()
if command -v kubectl > /dev/null; then
  kustomize=(kubectl kustomize)
elif command -v kustomize > /dev/null; then
  kustomize=(kustomize build)
fi
if [[ ${#kustomize[@]} == 0 ]]; then
  echo "note: neither kubectl nor kustomize is installed; the kustomization is not rendered"
elif ! "${kustomize[@]}" "$render" > "$tmp/rendered.yaml" 2> "$tmp/render.log"; then
  cat "$tmp/render.log"
  bad "${kustomize[*]} deploy/k8s"
else
  cat > "$tmp/render_check.py" <<'EOF'
import subprocess
import sys

import yaml

path, validate, versions = sys.argv[1], sys.argv[2], sys.argv[3:]
docs = [d for d in yaml.safe_load_all(open(path)) if d]
secrets = [d["metadata"]["name"] for d in docs if d["kind"] == "Secret"]
assert len(secrets) == 1 and secrets[0].startswith("capstan-token-"), f"Secrets rendered: {secrets}"
for doc in docs:
    if doc["kind"] in ("StatefulSet", "Deployment"):
        for volume in doc["spec"]["template"]["spec"].get("volumes") or []:
            if "secret" in volume:
                name = volume["secret"]["secretName"]
                assert name == secrets[0], f"{doc['metadata']['name']} mounts Secret {name}, not {secrets[0]}"
run = subprocess.run([validate, "--strict"] + [a for v in versions for a in ("-k", v)] + [path],
                     capture_output=True, text=True)
lines = (run.stdout + run.stderr).splitlines()
passes = [l for l in lines if l.startswith("INFO ") and " passed for resource " in l]
assert run.returncode == 0 and len(passes) == len(docs) * len(versions) and len(lines) == len(passes), \
    "\n".join(l for l in lines if l not in passes) or f"exit {run.returncode}"
print(f"{len(docs)} documents, Secret {secrets[0]}")
EOF
  if "$python" "$tmp/render_check.py" "$tmp/rendered.yaml" "$validate" "${versions[@]}" \
       > "$tmp/render-check.log" 2>&1; then
    ok "${kustomize[*]} renders deploy/k8s: $(tail -n 1 "$tmp/render-check.log"), all valid"
  else
    cat "$tmp/render-check.log"
    bad "the rendered kustomization"
  fi
fi

# --- Self-check: broken copies must fail, for the reason broken ----------------
# expect_failure NAME PATTERN EDIT...: copies deploy/k8s, runs EDIT in the
# copy, and requires the checks to fail with a line matching PATTERN. The
# schemas of the newest version are enough to catch a broken field (each
# version takes seconds: all of them for every copy was 70% of the test).
expect_failure() {
  local name=$1 pattern=$2
  shift 2
  local copy=$tmp/broken-$name
  rm -rf "$copy"
  cp -r "$manifests" "$copy"
  (cd "$copy" && "$@")
  if check_dir "$copy" "${versions[-1]}"; then
    cat "$tmp/last.log"
    bad "self-check '$name': the broken copy passed"
  elif ! grep -q -- "$pattern" "$tmp/last.log"; then
    cat "$tmp/last.log"
    bad "self-check '$name': failed, but not with /$pattern/"
  else
    ok "self-check '$name' fails: $(grep -m1 -- "$pattern" "$tmp/last.log")"
  fi
}

expect_failure bad-type "did not validate" \
  sed -i 's/containerPort: 7100/containerPort: seven-thousand-one-hundred/' ps.yaml
expect_failure unknown-field "was unexpected" \
  sed -i 's/^  replicas: 2$/  replica: 2/' ps.yaml
expect_failure misspelled-kind "Couldn't find schema" \
  sed -i 's/^kind: PodDisruptionBudget$/kind: PodDisruptonBudget/' ps.yaml
expect_failure unlisted-manifest "does not list extra.yaml" \
  sh -c 'sed -n "1,/^---/p" ps.yaml | sed "/^---/d; s/name: capstan-ps$/name: capstan-extra/" > extra.yaml'
expect_failure literal-token "holds literal data" \
  sh -c 'printf "apiVersion: v1\nkind: Secret\nmetadata: {name: capstan-token}\nstringData: {token: hunter2}\n" > secret.yaml && sed -i "s/^resources:$/resources:\n  - secret.yaml/" kustomization.yaml'
expect_failure placeholder-token "change-me" \
  sed -i 's/^      - token$/      - token=change-me/' kustomization.yaml
expect_failure num-ps "--num-ps=3" \
  sed -i 's/--num-ps=2/--num-ps=3/' coordinator.yaml
expect_failure no-limit "no memory limit" \
  sed -i '/limits: {cpu: "1", memory: 512Mi}/d' data-dispatcher.yaml
expect_failure cache-over-limit "more than half the memory limit" \
  sed -i 's/--buffer-cache-mib=64/--buffer-cache-mib=1024/' data-dispatcher.yaml

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
