#!/usr/bin/env bash
# The controller's OCI image, from Debian's packages only: a bookworm minbase root file system
# (mmdebstrap, from the Debian mirror) with the tether-controller .deb installed by apt-get,
# committed with buildah and written as an OCI archive. No registry is involved.
#
# Usage: packaging/deb/oci/build-image.sh DEB [OUT.tar]     (root; buildah, mmdebstrap)
#   DEB   dist/tether-controller_VERSION_amd64.deb (make deb)
#   OUT   default dist/tether-controller_VERSION_oci.tar, the image localhost/tether-controller:VERSION
#         (not kept in the local image store: load it from OUT)
# Run:  podman load -i OUT
#       podman run -d -p 7443:7443 -v tether-controller:/var/lib/tether-controller \
#           localhost/tether-controller:VERSION --listen 0.0.0.0:7443 --advertise HOST:7443
# The entrypoint is `tether-controller serve --data-dir /var/lib/tether-controller` as the user
# tether; arguments are more serve flags (default --listen 0.0.0.0:7443).
set -euo pipefail
deb=$(realpath "$1")
version=$(dpkg-deb --field "$deb" Version)
out=${2:-$(dirname "$deb")/tether-controller_${version}_oci.tar}
tag=localhost/tether-controller:$version
cache=${TETHER_OCI_CACHE:-$(dirname "$(realpath "$0")")/../../../.cache/oci}
mkdir -p "$cache"
base=$cache/bookworm-minbase.tar
if [ ! -s "$base" ]; then   # the same packages every time: built once, kept
    mmdebstrap --quiet --variant=minbase --include=python3,adduser,systemd \
        bookworm "$base.tmp" http://deb.debian.org/debian
    mv "$base.tmp" "$base"
fi
export BUILDAH_ISOLATION=chroot
ctr=$(buildah from scratch)
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
buildah add --quiet "$ctr" "$base" /
buildah copy --quiet "$ctr" "$deb" /tmp/tether-controller.deb
buildah run "$ctr" -- sh -ec 'DEBIAN_FRONTEND=noninteractive apt-get install -y -q /tmp/tether-controller.deb
    rm -f /tmp/tether-controller.deb; apt-get clean; rm -rf /var/lib/apt/lists/*
    install -d -o tether -g tether -m 0700 /var/lib/tether-controller'
buildah config --user tether --workingdir /var/lib/tether-controller --port 7443 \
    --volume /var/lib/tether-controller --stop-signal SIGTERM \
    --label org.opencontainers.image.title=tether-controller \
    --label org.opencontainers.image.version="$version" \
    --entrypoint '["/usr/bin/tether-controller", "serve", "--data-dir", "/var/lib/tether-controller"]' \
    --cmd '["--listen", "0.0.0.0:7443"]' "$ctr"
buildah commit --quiet --rm "$ctr" "$tag" >/dev/null
trap - EXIT
rm -f "$out"
buildah push --quiet "$tag" "oci-archive:$out:$tag"
buildah rmi "$tag" >/dev/null
echo "$out ($tag)"
