#!/usr/bin/env bash
# debian-rootfs.sh DIR PACKAGE...: a minimal root file system for make images, unpacked from Debian's
# own packages (apt-get download + dpkg-deb -x; no container engine, no registry). When busybox-static
# is among the packages, its applets are linked into /bin so the image has a shell and core tools.
# /etc/passwd and /etc/group name root and the distroless "nonroot" user (65532) the manager runs as.
set -euo pipefail
dir="$1"; shift
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cache="${DEB_CACHE:-$ROOT/bin/.debs}"
mkdir -p "$cache"
for pkg in "$@"; do
  if ! ls "$cache/${pkg}_"*.deb >/dev/null 2>&1; then
    # A fresh machine has no package lists yet.
    (cd "$cache" && { apt-get download "$pkg" >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get download "$pkg" >/dev/null; }; })
  fi
done
rm -rf "$dir"; mkdir -p "$dir"
for pkg in "$@"; do dpkg-deb -x "$(ls "$cache/${pkg}_"*.deb | head -1)" "$dir"; done
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
