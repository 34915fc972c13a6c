#!/usr/bin/env bash
# helm-check: what `make helm-check` (and `make test`) runs for the chart.
#  1. helm lint --strict and helm template, for the default values and every
#     deploy/helm/examples/values/*.yaml, and for the example app chart that
#     uses the sidecar templates;
#  2. deploycheck manifest on each rendering: the rendered rtproxy.yaml must
#     load and validate with the proxy's own config code, and the container
#     ports, probes, mounts and Service ports must match it;
#  3. `rtproxy check` on the rule files extracted from each rules ConfigMap,
#     and `rtproxy test` on the test files among them;
#  4. shared routes: three replicas with rules render, standalone and as the
#     sidecar of a three-replica app, with 3 replicas and the rule files
#     (every rendering's replicas are checked against its replicaCount);
#  5. every deploy/helm/tests/bad/*.yaml must make `helm template` fail with
#     the message named on its first line (`# expect: ...`).
# Needs only Go; helm is built from the Go module proxy (deploy/scripts/lib.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
. deploy/scripts/lib.sh

HELM=$(ensure_helm)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/helm-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
CHART=deploy/helm/rtproxy

echo "helm-check: $("$HELM" version --short 2>/dev/null || echo helm) ; building deploycheck and rtproxy"
go build -o "$WORK/deploycheck" ./deploy/deploycheck
if ! go build -o "$WORK/rtproxy" ./cmd/rtproxy 2>"$WORK/build.log"; then
	cat "$WORK/build.log" >&2
	echo "helm-check: FAIL: go build ./cmd/rtproxy failed; rule files cannot be checked" >&2
	exit 1
fi

# image.tag must follow Chart.yaml appVersion: the sidecar templates render in
# the app chart's context and cannot read this chart's appVersion.
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$CHART/Chart.yaml")
image_tag=$(sed -n '/^image:/,/^[^ ]/s/^  tag: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$CHART/values.yaml")
if [ -n "$app_version" ] && [ "$app_version" = "$image_tag" ]; then
	ok "values.yaml image.tag $image_tag = Chart.yaml appVersion"
else
	fail "values.yaml image.tag '$image_tag' differs from Chart.yaml appVersion '$app_version'"
fi

# check_rules DIR NAME: run `rtproxy check` on the extracted rule files, and
# `rtproxy test` on the test files among them (NAME.test.yaml).
check_rules() {
	local dir=$1 name=$2
	local present=() tests=()
	for f in "$dir"/*.yaml "$dir"/*.yml; do
		[ -e "$f" ] || continue
		case "$f" in
		*.test.yaml | *.test.yml) tests+=("$f") ;;
		*) present+=("$f") ;;
		esac
	done
	if [ ${#present[@]} -eq 0 ]; then
		ok "$name: no rule files to check"
		return
	fi
	local out rc=0
	out=$("$WORK/rtproxy" check "${present[@]}" 2>&1) || rc=$?
	if [ $rc -eq 0 ]; then
		ok "$name: rtproxy check accepts ${#present[@]} rule file(s)"
	else
		fail "$name: rtproxy check (exit $rc):"
		sed 's/^/         /' <<<"$out" >&2
	fi
	if [ ${#tests[@]} -eq 0 ]; then
		return
	fi
	rc=0
	out=$("$WORK/rtproxy" test "${tests[@]}" 2>&1) || rc=$?
	if [ $rc -eq 0 ]; then
		ok "$name: rtproxy test passes $(grep -c '^ok' <<<"$out") test file(s) of the rules ConfigMap"
	else
		fail "$name: rtproxy test (exit $rc):"
		sed 's/^/         /' <<<"$out" >&2
	fi
}

# has_rules NAME: fail unless the rendering NAME put rule files in its ConfigMap.
has_rules() {
	local n=0
	if [ -d "$WORK/rules-$1" ]; then
		n=$(find "$WORK/rules-$1" -maxdepth 1 \( -name '*.yaml' -o -name '*.yml' \) | wc -l)
	fi
	if [ "$n" -gt 0 ]; then
		ok "$1: $n rule file(s) rendered beside $replicas replicas"
	else
		fail "$1: no rule files rendered; the shared-routes check needs rules"
	fi
}

# replicas_of FILE: the replicaCount a values file sets (1 when it sets none).
replicas_of() {
	local n
	n=$(sed -n 's/^replicaCount: *\([0-9][0-9]*\).*$/\1/p' "$1")
	echo "${n:-1}"
}

# render NAME WORKLOADS CHART [helm args...]: lint, template, deploycheck, rules.
# Every workload running the proxy must have $replicas replicas.
replicas=1
render() {
	local name=$1 workloads=$2 chart=$3
	shift 3
	local out
	if out=$("$HELM" lint --strict "$chart" "$@" 2>&1); then
		ok "$name: helm lint --strict"
	else
		fail "$name: helm lint --strict:"
		sed 's/^/         /' <<<"$out" >&2
		return
	fi
	if ! "$HELM" template "rtp-check" "$chart" --namespace check "$@" >"$WORK/$name.yaml" 2>"$WORK/$name.err"; then
		fail "$name: helm template:"
		sed 's/^/         /' "$WORK/$name.err" >&2
		return
	fi
	ok "$name: helm template ($(grep -c '^kind:' "$WORK/$name.yaml") objects)"
	if out=$("$WORK/deploycheck" manifest -rendered "$WORK/$name.yaml" -workloads "$workloads" -replicas "$replicas" -rules-out "$WORK/rules-$name" 2>&1); then
		ok "$name: rendered ports, probes, mounts and replicas ($replicas) match"
	else
		fail "$name: deploycheck manifest:"
		sed 's/^/         /' <<<"$out" >&2
		return
	fi
	check_rules "$WORK/rules-$name" "$name"
}

echo "helm-check: chart $CHART"
replicas=1
render default 1 "$CHART"
for values in deploy/helm/examples/values/*.yaml; do
	name=$(basename "$values" .yaml)
	workloads=1
	grep -q '^mode: *sidecar' "$values" && workloads=0
	replicas=$(replicas_of "$values")
	render "$name" "$workloads" "$CHART" -f "$values"
done

echo "helm-check: shared routes: 3 replicas with rules (standalone)"
# Routes are shared through their consumer groups (docs/ARCHITECTURE.md):
# the chart must render several replicas with rules, state on the emptyDir.
replicas=3
render shared-standalone 1 "$CHART" -f deploy/helm/examples/values/standalone.yaml \
	--set replicaCount=3 --set state.type=emptyDir
has_rules shared-standalone

echo "helm-check: example app chart (sidecar templates)"
# Work on a copy: `helm dependency build` writes charts/ and Chart.lock.
cp -r deploy/helm "$WORK/helm"
APP="$WORK/helm/examples/app"
if out=$("$HELM" dependency build "$APP" 2>&1); then
	replicas=$(replicas_of "$APP/values.yaml")
	render app 1 "$APP"
	echo "helm-check: shared routes: the sidecar beside a 3-replica app, with rules"
	replicas=3
	render shared-app 1 "$APP" --set replicaCount=3
	has_rules shared-app
	if "$HELM" template x "$APP" --set rtproxy.proxy.adminPort=not-a-port >/dev/null 2>"$WORK/app-bad.err" ; then
		fail "app: --set rtproxy.proxy.adminPort=not-a-port rendered; the rtproxy schema must refuse it through the app chart too"
	elif grep -q adminPort "$WORK/app-bad.err"; then
		ok "app: the rtproxy schema refuses bad values through the app chart"
	else
		fail "app: bad rtproxy value refused, but not by the schema: $(cat "$WORK/app-bad.err")"
	fi
else
	fail "app: helm dependency build: $out"
fi

echo "helm-check: values the chart must refuse"
for values in deploy/helm/tests/bad/*.yaml; do
	name=$(basename "$values" .yaml)
	expect=$(sed -n '1s/^# expect: //p' "$values")
	if [ -z "$expect" ]; then
		fail "$values: first line must be '# expect: <text of the error>'"
		continue
	fi
	if "$HELM" template x "$CHART" -f "$values" >/dev/null 2>"$WORK/bad.err"; then
		fail "$name: rendered, but must be refused ($expect)"
	elif grep -qF -- "$expect" "$WORK/bad.err"; then
		ok "$name: refused: $(grep -m1 -F -- "$expect" "$WORK/bad.err" | sed 's/^[- ]*//')"
	else
		fail "$name: refused, but the error does not mention '$expect':"
		sed 's/^/         /' "$WORK/bad.err" >&2
	fi
done

if [ "$failures" -gt 0 ]; then
	echo "helm-check: $failures failure(s)" >&2
	exit 1
fi
echo "helm-check: ok"
