# Shared by helm-check.sh and image-check.sh (sourced, not run).
#
# ensure_helm prints the path of a helm v3.22.0 binary. It uses $HELM when
# set, else ./bin/helm when that is the right version, else builds it once
# into ./bin from the Go module proxy (about 3 minutes on 2 cores).

HELM_MODULE_VERSION=v3.22.0

ensure_helm() {
	if [ -n "${HELM:-}" ]; then
		echo "$HELM"
		return
	fi
	local bin="$ROOT/bin/helm"
	if [ -x "$bin" ] && go version -m "$bin" 2>/dev/null | grep -Eq "helm\.sh/helm/v3[[:space:]]+$HELM_MODULE_VERSION"; then
		echo "$bin"
		return
	fi
	echo "deploy: building helm $HELM_MODULE_VERSION into $ROOT/bin (once)" >&2
	GOBIN="$ROOT/bin" go install "helm.sh/helm/v3/cmd/helm@$HELM_MODULE_VERSION" >&2
	echo "$bin"
}

# ok and fail print one line each; fail also counts.
failures=0
ok() { echo "  ok   $*"; }
fail() {
	echo "  FAIL $*" >&2
	failures=$((failures + 1))
}
