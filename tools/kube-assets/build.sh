#!/usr/bin/env bash
# Build the real Kubernetes test binaries (etcd, kube-apiserver, kubectl) from
# Go modules into an envtest-style directory, and print that directory on the
# last line of stdout:
#
#     KUBEBUILDER_ASSETS=$(tools/kube-assets/build.sh)
#
# Test infrastructure only; see README.md beside this file.
#
# Versions come from the go.mod files beside this script (k8s.io/kubernetes in
# ./go.mod, go.etcd.io/etcd/server/v3 in ./etcd/go.mod).
#
# Idempotent: a binary that is present and reports the expected version is not
# rebuilt (a warm run needs no Go at all). A binary is built under a temporary
# name and moved into place only when its build succeeded.
#
# Environment:
#   KOPF_KUBE_ASSETS_CACHE  cache root (default: $HOME/.cache/kopf/kube-assets);
#                           the binaries go to $KOPF_KUBE_ASSETS_CACHE/k8s-vX.Y.Z/
#   GOTOOLCHAIN             default "local": never download a Go toolchain.
#
# Exit codes: 0 ok; 3 no usable Go (not installed or too old); other non-zero:
# the build failed (go's own error is on stderr).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { printf 'kube-assets: %s\n' "$*" >&2; }
die() { log "$1"; exit "${2:-1}"; }

# The version that a module requires in a go.mod, with no need of Go itself.
required_version() {  # <go.mod> <module path>
    awk -v mod="$2" '
        $1 == "require" && $2 == mod { print $3; exit }
        $1 == mod && $2 ~ /^v/ { print $2; exit }
    ' "$1"
}

k8s_version="$(required_version "$here/go.mod" k8s.io/kubernetes)"
etcd_version="$(required_version "$here/etcd/go.mod" go.etcd.io/etcd/server/v3)"
[[ "$k8s_version" =~ ^v1\.([0-9]+)\.[0-9]+$ ]] \
    || die "cannot read the k8s.io/kubernetes version from $here/go.mod"
k8s_minor="${BASH_REMATCH[1]}"
[[ "$etcd_version" =~ ^v3\.[0-9]+\.[0-9]+$ ]] \
    || die "cannot read the go.etcd.io/etcd/server/v3 version from $here/etcd/go.mod"

cache_root="${KOPF_KUBE_ASSETS_CACHE:-${HOME:?HOME is not set}/.cache/kopf/kube-assets}"
dest="$cache_root/k8s-$k8s_version"
mkdir -p "$dest"

# One build at a time per cache (e.g. parallel tox environments).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$cache_root/.lock"
    flock 9
fi

# Is the binary there, and does it report the expected version?
is_current() {  # <name>
    local bin="$dest/$1"
    local out expected
    [[ -x "$bin" ]] || return 1
    # Captured whole, not piped into `grep -q` (which, with pipefail, fails
    # on the writer's SIGPIPE when it matches before the output ends).
    case "$1" in
        kube-apiserver) out="$("$bin" --version 2>/dev/null)" expected="Kubernetes $k8s_version" ;;
        kubectl) out="$("$bin" version --client 2>/dev/null)" expected="Client Version: $k8s_version" ;;
        etcd) out="$("$bin" --version 2>/dev/null)" expected="etcd Version: ${etcd_version#v}" ;;
    esac || return 1
    [[ $'\n'"$out"$'\n' == *$'\n'"$expected"$'\n'* ]]
}

k8s_missing=()
for name in kube-apiserver kubectl; do
    is_current "$name" || k8s_missing+=("$name")
done
etcd_missing=()
is_current etcd || etcd_missing+=(etcd)

if (( ${#k8s_missing[@]} + ${#etcd_missing[@]} == 0 )); then
    log "up to date: $dest (Kubernetes $k8s_version, etcd $etcd_version)"
    printf '%s\n' "$dest"
    exit 0
fi

# --- From here on, something has to be built: Go is needed. ---
command -v go >/dev/null 2>&1 \
    || die "Go is not installed (no 'go' in PATH): cannot build the Kubernetes test binaries" 3

export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export GOWORK=off        # never pick up a go.work from a parent directory
export CGO_ENABLED=0
go_version="$(go env GOVERSION 2>/dev/null || true)"
if [[ "$GOTOOLCHAIN" == local && "$go_version" =~ ^go1\.([0-9]+) ]] && (( BASH_REMATCH[1] < 26 )); then
    die "Go $go_version is too old: these modules need Go >= 1.26" 3
fi

tmp="$(mktemp -d "$cache_root/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# -mod=readonly: build exactly what the committed go.mod/go.sum say (it beats
# any -mod in the caller's GOFLAGS); modules come from the Go module proxy.
go_build=(go build -mod=readonly -trimpath)

if (( ${#etcd_missing[@]} )); then
    log "building etcd $etcd_version with $go_version (go.etcd.io/etcd/server/v3) ..."
    start=$SECONDS
    (cd "$here/etcd" && "${go_build[@]}" -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3) \
        || die "building etcd $etcd_version failed (the go error is above)" "$?"
    mv -f "$tmp/etcd" "$dest/etcd"
    log "built etcd in $((SECONDS - start))s"
fi

if (( ${#k8s_missing[@]} )); then
    # The release's own timestamp (from the module proxy), not the build's:
    # the same inputs give the same binaries.
    build_date="$(cd "$here" && go list -mod=readonly -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes 2>/dev/null || true)"
    build_date="${build_date:-1970-01-01T00:00:00Z}"
    ldflags="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.gitVersion=$k8s_version"
        ldflags+=" -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
        ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit="
        ldflags+=" -X $pkg.buildDate=$build_date"
    done
    pkgs=()
    for name in "${k8s_missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$name"); done
    log "building ${k8s_missing[*]} $k8s_version with $go_version (k8s.io/kubernetes) ..."
    start=$SECONDS
    (cd "$here" && "${go_build[@]}" -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}") \
        || die "building ${k8s_missing[*]} $k8s_version failed (the go error is above)" "$?"
    for name in "${k8s_missing[@]}"; do
        mv -f "$tmp/$name" "$dest/$name"
    done
    log "built ${k8s_missing[*]} in $((SECONDS - start))s"
fi

for name in etcd kube-apiserver kubectl; do
    is_current "$name" || die "$dest/$name does not report the expected version after the build"
done
log "ready: $dest (Kubernetes $k8s_version, etcd $etcd_version)"
printf '%s\n' "$dest"
