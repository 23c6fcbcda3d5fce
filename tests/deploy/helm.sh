#!/usr/bin/env bash
# Tests the Helm chart helm/samsa without Helm and without a cluster:
#
#  1. installs what is missing: Debian packages (Go and the Go libraries the
#     renderer uses, from Debian, GOPATH mode: no module proxy) and a Python
#     venv under ${CARGO_TARGET_DIR:-target}/helm-venv with
#     kubernetes-validate (the Kubernetes OpenAPI schemas, offline) and the
#     prometheus-operator models (for the ServiceMonitor CRD);
#  2. builds tests/deploy/helm-render (Helm's template engine: Go
#     text/template + sprig v3 + Helm's functions) into the target dir;
#  3. checks the renderer against fixture charts of known Helm output
#     (tests/deploy/helm-fixtures);
#  4. renders helm/samsa with the default values and each variant in
#     tests/deploy/helm-values/, validates every object against the newest
#     Kubernetes schema kubernetes-validate ships (strict: unknown fields
#     fail) and checks the structure (tests/deploy/helm-check.py);
#  5. checks that invalid values (tests/deploy/helm-values/invalid/) are
#     refused, by values.schema.json or by the chart's own `fail`s, with the
#     expected message;
#  6. only with SAMSA_HELM_IMAGE=<image> (one built by deploy/build-image.sh)
#     and Docker: runs the rendered pods of the broker-only values (three
#     voters, then a broker-only pod, as after a scale-up) as containers the
#     way the StatefulSet would (the ConfigMap mounted read-only at
#     /etc/samsa, the container's args, host name = pod name, the pod DNS
#     name as network alias, read-only root file system, uid 10001, no
#     capabilities) and checks that they become ready (/readyz), form the
#     quorum, replicate a topic of replication factor 3, and that the
#     broker-only pod joins and takes replicas in `samsa cluster rebalance`.
#
# Exits non-zero on the first failure. Needs root only when packages are
# missing. tests/run-all.sh runs it with its image.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
case "$TARGET" in /*) ;; *) TARGET=$ROOT/$TARGET ;; esac
CHART=$ROOT/helm/samsa
HERE=$ROOT/tests/deploy

# Debian bookworm package names (versions there: golang-go 1.19, sprig
# 3.2.3, sigs.k8s.io/yaml 1.3, BurntSushi/toml 1.2, gojsonschema 1.2).
APT_PACKAGES=(
  golang-go
  golang-github-masterminds-sprig-dev
  golang-k8s-sigs-yaml-dev
  golang-github-burntsushi-toml-dev
  golang-github-xeipuuv-gojsonschema-dev
)
PIP_PACKAGES=(
  kubernetes-validate==1.37.0
  cloudcoil==0.6.0
  cloudcoil.models.prometheus-operator==0.80.1.0
)

START=$(date +%s)
phase_start=$START
phase() {
  local now
  now=$(date +%s)
  echo "-- $1 ($((now - phase_start)) s)"
  phase_start=$now
}

passed=0
pass() {
  passed=$((passed + 1))
  echo "ok: $1"
}
fail() {
  echo "FAILED: $1" >&2
  echo "$passed passed, 1 failed"
  exit 1
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/samsa-helm.XXXXXX")
PREFIX=samsa-helmtest-$$
cleanup() {
  if [ -n "${SAMSA_HELM_IMAGE:-}" ]; then
    docker rm -f "$PREFIX-0" "$PREFIX-1" "$PREFIX-2" "$PREFIX-3" >/dev/null 2>&1 || true
    docker network rm "$PREFIX" >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# ---------------------------------------------------------------- install
missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "missing Debian packages (run as root, or install them): ${missing[*]}" >&2
    exit 1
  fi
  echo "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

VENV=$TARGET/helm-venv
STAMP="$VENV/.samsa-helm-packages"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "${PIP_PACKAGES[*]}" ]; then
  echo "creating $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "${PIP_PACKAGES[@]}"
  echo "${PIP_PACKAGES[*]}" >"$STAMP"
fi
PY=$VENV/bin/python
phase "installed"

# ------------------------------------------------------------------ build
# GOPATH mode over Debian's /usr/share/gocode. Debian installs sprig and
# semver v3 without the /v3 directory that their import paths name, so a
# small GOPATH in the target dir links them under it.
GOPATH_OVERLAY=$TARGET/helm-gopath
mkdir -p "$GOPATH_OVERLAY/src/github.com/Masterminds/sprig" "$GOPATH_OVERLAY/src/github.com/Masterminds/semver"
ln -sfn /usr/share/gocode/src/github.com/Masterminds/sprig "$GOPATH_OVERLAY/src/github.com/Masterminds/sprig/v3"
ln -sfn /usr/share/gocode/src/github.com/Masterminds/semver "$GOPATH_OVERLAY/src/github.com/Masterminds/semver/v3"
RENDER=$TARGET/helm-render
(cd "$ROOT" && GO111MODULE=off GOFLAGS= GOPROXY=off GOPATH="$GOPATH_OVERLAY:/usr/share/gocode" \
  GOCACHE="$TARGET/helm-gocache" go build -o "$RENDER" ./tests/deploy/helm-render)
phase "built $RENDER"

# ----------------------------------------------------- renderer fixtures
FX=$HERE/helm-fixtures
(cd "$FX" && "$RENDER" --name rel --namespace ns --kube-version v1.37.0 --api-versions example.com/v1 \
  -f fixture/values-1.yaml -f fixture/values-2.yaml --notes-out "$WORK/fx-notes.txt" fixture >"$WORK/fx.yaml") ||
  fail "fixture chart did not render"
diff -u "$FX/fixture/expected.yaml" "$WORK/fx.yaml" >&2 || fail "fixture output differs from Helm's (include/nindent, toYaml, tpl, default, missing keys, null deletion, kind order, document splitting)"
pass "fixture: manifests as helm template prints them"
diff -u "$FX/fixture/expected-notes.txt" "$WORK/fx-notes.txt" >&2 || fail "fixture NOTES.txt differs"
pass "fixture: NOTES.txt rendered apart"

if "$RENDER" "$FX/fixture-required" >"$WORK/out" 2>"$WORK/err"; then fail "required with an empty value rendered"; fi
grep -qxF "Error: execution error at (fixture-required/templates/required.yaml:1:3): need foo" "$WORK/err" ||
  fail "required's error message: $(cat "$WORK/err")"
pass "fixture: required fails with Helm's message"
if "$RENDER" "$FX/fixture-env" >"$WORK/out" 2>"$WORK/err"; then fail "env is a template function, Helm removes it"; fi
grep -qF 'function "env" not defined' "$WORK/err" || fail "env's error: $(cat "$WORK/err")"
pass "fixture: env is not defined"
phase "renderer fixtures"

# ------------------------------------------------------------ the chart
KUBE=$("$PY" -c 'from kubernetes_validate import utils; print(utils.all_versions()[-1])')
echo "Kubernetes schema version: $KUBE (newest in kubernetes-validate)"

render() { # case values-file(or "") → $WORK/$case.yaml, $WORK/$case-notes.txt
  local args=(--name samsa --namespace samsa-ns --kube-version "v$KUBE" --notes-out "$WORK/$1-notes.txt")
  [ -n "$2" ] && args+=(-f "$2")
  "$RENDER" "${args[@]}" "$CHART" >"$WORK/$1.yaml"
}

for c in default replicas-5 broker-only external-nodeport external-loadbalancer custom secure; do
  file=""
  [ "$c" = default ] || file=$HERE/helm-values/$c.yaml
  render "$c" "$file" || fail "$c: rendering failed"
  "$PY" "$HERE/helm-check.py" "$c" "$WORK/$c.yaml" "$WORK/$c-notes.txt" "$KUBE" || fail "$c: checks"
  pass "$c: rendered, validated, checked"
done

# An even count is refused (below) unless allowed.
printf 'replicas: 4\nallowEvenReplicas: true\n' >"$WORK/values-even-allowed.yaml"
render even-allowed "$WORK/values-even-allowed.yaml" || fail "replicas 4 with allowEvenReplicas refused"
grep -q 'controller_quorum_voters = "1@samsa-0.*,4@samsa-3\.' "$WORK/even-allowed.yaml" || fail "replicas 4: four voters"
pass "even-allowed: replicas 4 renders with allowEvenReplicas"
phase "chart renderings"

# ------------------------------------------------------- invalid values
declare -A REFUSED=(
  [typo]="(root): Additional property replica is not allowed"
  [nested-typo]="persistence: Additional property sise is not allowed"
  [wrong-type]="replicas: Invalid type. Expected: integer, given: string"
  [replicas-0]="replicas: Must be greater than or equal to 1"
  [replicas-even]="replicas is 2: a controller quorum of 2 nodes"
  [controllers-over-replicas]="controllers is 5 but replicas is 3"
  [external-no-host]="externalAccess.enabled with type NodePort needs externalAccess.host"
  [external-lb-no-addresses]="externalAccess.enabled needs one advertised address per broker: 3 replicas but 0 addresses"
  [external-count-mismatch]="externalAccess.enabled needs one advertised address per broker: 3 replicas but 2 addresses"
  [security-no-secret]="security: an SSL or SASL_SSL listener, or interNodeTls, needs security.tlsSecret"
  [acls-without-authorizer]="security.authorizer.acls needs security.authorizer.enabled"
  [acl-bad-resource-type]="resourceType: security.authorizer.acls.0.resourceType must be one of the following"
)
for f in "$HERE"/helm-values/invalid/*.yaml; do
  c=$(basename "$f" .yaml)
  want=${REFUSED[$c]:-}
  [ -n "$want" ] || fail "invalid/$c.yaml has no expected message in tests/deploy/helm.sh"
  if render "invalid-$c" "$f" 2>"$WORK/err"; then fail "invalid/$c.yaml was accepted"; fi
  grep -qF -- "$want" "$WORK/err" || fail "invalid/$c.yaml refused with another message: $(cat "$WORK/err")"
  [ ! -s "$WORK/invalid-$c.yaml" ] || fail "invalid/$c.yaml: output despite the error"
  pass "invalid/$c refused: $want"
done
[ "$(ls "$HERE"/helm-values/invalid/*.yaml | wc -l)" = "${#REFUSED[@]}" ] || fail "every expected refusal has its values file"
phase "invalid values"

# ------------------------------------------- optional: the pods in Docker
if [ -n "${SAMSA_HELM_IMAGE:-}" ]; then
  mkdir -p "$WORK/pod"
  # The ConfigMap's samsa.toml and the container's args, from the rendering.
  "$PY" - "$WORK/broker-only.yaml" "$WORK/pod" <<'PYEOF' >"$WORK/pod/args"
import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d["kind"] == "ConfigMap":
        open(sys.argv[2] + "/samsa.toml", "w").write(d["data"]["samsa.toml"])
    if d["kind"] == "StatefulSet":
        print("\n".join(d["spec"]["template"]["spec"]["containers"][0]["args"]))
PYEOF
  chmod -R a+rX "$WORK"
  mapfile -t ARGS <"$WORK/pod/args"
  docker network create "$PREFIX" >/dev/null
  start_pod() {
    docker run -d --name "$PREFIX-$1" --network "$PREFIX" --hostname "samsa-$1" \
      --network-alias "samsa-$1.samsa-headless.samsa-ns.svc.cluster.local" \
      --read-only --tmpfs /tmp --tmpfs /var/lib/samsa:uid=10001,gid=10001 \
      --user 10001:10001 --cap-drop ALL --security-opt no-new-privileges \
      -v "$WORK/pod:/etc/samsa:ro" "$SAMSA_HELM_IMAGE" "${ARGS[@]}" >/dev/null
  }
  wait_ready() {
    local deadline=$(($(date +%s) + 120))
    until docker exec "$PREFIX-$1" samsa health --url http://127.0.0.1:9644/readyz >/dev/null 2>&1; do
      [ "$(date +%s)" -lt "$deadline" ] || { docker logs "$PREFIX-$1" 2>&1 | tail -20 >&2; fail "pod samsa-$1 not ready within 120 s"; }
      sleep 0.5
    done
  }
  # The three voters first; the broker-only pod joins later, as after
  # `kubectl scale --replicas 4`.
  for i in 0 1 2; do start_pod $i; done
  for i in 0 1 2; do wait_ready $i; done
  pass "containers: the three rendered voter pods are ready (/readyz)"
  docker exec "$PREFIX-0" samsa cluster status --controller 127.0.0.1:9093 >"$WORK/status" 2>&1 || fail "cluster status: $(cat "$WORK/status")"
  [ "$(grep -cE '^ +[123] +samsa-[012]\.samsa-headless\.samsa-ns\.svc\.cluster\.local:9093 +(leader|follower)' "$WORK/status")" = 3 ] ||
    fail "three voters under their pod DNS names: $(cat "$WORK/status")"
  pass "containers: quorum of three voters under the pod DNS names"
  seq 100 | docker exec -i "$PREFIX-1" samsa produce helmcheck -b samsa-0.samsa-headless.samsa-ns.svc.cluster.local:9092 >/dev/null 2>&1 || fail "produce"
  docker exec "$PREFIX-2" samsa topic describe helmcheck -b 127.0.0.1:9092 >"$WORK/describe" 2>&1 || fail "describe: $(cat "$WORK/describe")"
  grep -q 'ReplicationFactor: 3' "$WORK/describe" || fail "default replication factor 3: $(cat "$WORK/describe")"
  got=$(docker exec "$PREFIX-2" timeout 60 samsa consume helmcheck -b samsa-1.samsa-headless.samsa-ns.svc.cluster.local:9092 --from-beginning --max-messages 100 2>/dev/null | wc -l)
  [ "$got" = 100 ] || fail "consumed $got of 100 records"
  pass "containers: 100 records through a topic of replication factor 3"
  docker exec "$PREFIX-0" samsa topic create spread --partitions 4 -b 127.0.0.1:9092 >/dev/null 2>&1 || fail "create topic spread"
  seq 200 | docker exec -i "$PREFIX-0" samsa produce spread -b 127.0.0.1:9092 >/dev/null 2>&1 || fail "produce to spread"
  start_pod 3
  wait_ready 3
  docker exec "$PREFIX-0" samsa cluster rebalance -b 127.0.0.1:9092 --timeout 120 >"$WORK/rebalance" 2>&1 || fail "rebalance: $(cat "$WORK/rebalance")"
  # Every topic's placement (the rebalance evens replica counts over all
  # of them, the coordinators' topics included).
  docker exec "$PREFIX-0" sh -c 'for t in $(samsa topic list -b 127.0.0.1:9092); do samsa topic describe "$t" -b 127.0.0.1:9092; done' \
    >"$WORK/describe" 2>&1 || fail "describe: $(cat "$WORK/describe")"
  on_new=$(grep -cE 'Replicas: ([0-9]+,)*4(,[0-9]+)*[[:space:]]' "$WORK/describe" || true)
  [ "$on_new" -gt 0 ] || fail "no replica on the new broker 4 after the rebalance: $(cat "$WORK/rebalance" "$WORK/describe")"
  echo "the rebalance put $on_new partition replicas on broker 4"
  docker exec "$PREFIX-0" samsa cluster status --controller 127.0.0.1:9093 >"$WORK/status" 2>&1 || fail "cluster status: $(cat "$WORK/status")"
  [ "$(grep -cE '^ +[1234] +samsa-[0123]\.samsa-headless\.samsa-ns\.svc\.cluster\.local:9093 +(leader|follower)' "$WORK/status")" = 3 ] ||
    fail "still three voters after the broker-only pod joined: $(cat "$WORK/status")"
  got=$(docker exec "$PREFIX-3" timeout 60 samsa consume spread -b samsa-3.samsa-headless.samsa-ns.svc.cluster.local:9092 --from-beginning --max-messages 200 2>/dev/null | wc -l)
  [ "$got" = 200 ] || fail "consumed $got of 200 records after the rebalance"
  pass "containers: a broker-only pod joins, takes replicas in a rebalance, and all 200 records are read"
  phase "containers"
fi

echo "helm chart: all checks passed in $(($(date +%s) - START)) s"
echo "$passed passed, 0 failed"
