#!/usr/bin/env bash
# debian-rootfs.sh DIR NAME=VERSION...: a minimal root file system for make images, unpacked from
# Debian's own packages (apt-get download + dpkg-deb -x; no container engine, no registry). Every package
# is pinned to a version (apt checks each download against the archive's signed index), and DIR.debs lists
# what went in (name, version, architecture, SHA-256 of the .deb) for the image's SBOM (hack/sbom). When
# busybox-static is among the packages, its applets are linked into /bin so the image has a shell and
# core tools. /etc/passwd and /etc/group name root and the distroless "nonroot" user (65532) the manager
# runs as.
set -euo pipefail
dir="$1"; shift
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cache="${DEB_CACHE:-$ROOT/bin/.debs}"
for spec in "$@"; do
  [[ "$spec" == ?*=?* ]] || { echo "debian-rootfs.sh: $spec is not pinned: want NAME=VERSION (apt-cache policy NAME lists the versions)" >&2; exit 2; }
done
mkdir -p "$cache"
# deb names the file of a pinned package as apt-get download writes it (an epoch's ':' as %3a).
deb() { local name="${1%%=*}" version="${1#*=}"; ls "$cache/${name}_${version//:/%3a}_"*.deb 2>/dev/null | head -1; }
for spec in "$@"; do
  if [[ -z "$(deb "$spec")" ]]; then
    # A fresh machine has no package lists yet.
    (cd "$cache" && { apt-get download "$spec" >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get download "$spec" >/dev/null; }; }) ||
      { echo "debian-rootfs.sh: apt cannot download $spec: the archive may have dropped that version; pin the one apt-cache policy ${spec%%=*} offers" >&2; exit 1; }
  fi
done
rm -rf "$dir" "$dir.debs"; mkdir -p "$dir"
for spec in "$@"; do
  f="$(deb "$spec")"
  got="$(dpkg-deb -f "$f" Package Version Architecture | awk -F': ' '{print $2}' | paste -sd' ')"
  read -r name version arch <<<"$got"
  [[ "$name=$version" == "$spec" ]] || { echo "debian-rootfs.sh: $f holds $name=$version, not $spec" >&2; exit 1; }
  echo "$name $version $arch $(sha256sum "$f" | cut -d' ' -f1)" >>"$dir.debs"
  dpkg-deb -x "$f" "$dir"
done
# Debian's usrmerge: /bin, /sbin and /lib are links into /usr, as in debian:bookworm-slim.
for d in bin sbin lib lib64; do
  if [[ -d "$dir/$d" && ! -L "$dir/$d" ]]; then mkdir -p "$dir/usr/$d"; cp -a "$dir/$d/." "$dir/usr/$d/"; rm -rf "${dir:?}/$d"; fi
  [[ -e "$dir/$d" ]] || { mkdir -p "$dir/usr/$d"; ln -s "usr/$d" "$dir/$d"; }
done
if [[ -x "$dir/usr/bin/busybox" ]]; then
  for applet in $("$dir/usr/bin/busybox" --list); do
    [[ -e "$dir/usr/bin/$applet" ]] || ln -s busybox "$dir/usr/bin/$applet"
  done
fi
rm -rf "${dir:?}/usr/share/doc" "${dir:?}/usr/share/man" "${dir:?}/usr/share/lintian" "${dir:?}/usr/share/locale"
mkdir -p "$dir/etc" "$dir/tmp" "$dir/proc" "$dir/sys" "$dir/dev" "$dir/run"
chmod 1777 "$dir/tmp"
printf 'root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$dir/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$dir/etc/group"
