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
#     expected message.
#
# Exits non-zero on the first failure. Needs root only when packages are
# missing. Not part of tests/run-all.sh.
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
trap 'rm -rf "$WORK"' EXIT

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

for c in default replicas-5 external-nodeport external-loadbalancer custom; do
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
  [external-no-host]="externalAccess.enabled with type NodePort needs externalAccess.host"
  [external-lb-no-addresses]="externalAccess.enabled needs one advertised address per broker: 3 replicas but 0 addresses"
  [external-count-mismatch]="externalAccess.enabled needs one advertised address per broker: 3 replicas but 2 addresses"
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

echo "helm chart: all checks passed in $(($(date +%s) - START)) s"
echo "$passed passed, 0 failed"
