#!/usr/bin/env bash
# build.sh AGNHOST REGISTRY [CA_OPTS]: builds the images the [NodeConformance] specs run, from
# Debian's busybox-static, the agnhost binary (../shared/conformance/setup.sh unpacks it) and small C programs
# here, and pushes them with skopeo to REGISTRY (host:port) under the registry.k8s.io paths, so a
# node whose registry mirror for registry.k8s.io points at REGISTRY pulls them by their real names.
# Needs: busybox-static, umoci, skopeo, gcc (static glibc). Set DEST_TLS=false for a plain-HTTP
# or self-signed registry (skopeo --dest-tls-verify=false).
set -euo pipefail
AGNHOST=$(readlink -f "${1:?path of agnhost}"); REG=${2:?registry host:port}
here=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
ARCH=${ARCH:-amd64}
gcc -static -O2 -o "$W/pause" "$here/pause.c"; gcc -static -O2 -o "$W/nnp" "$here/nnp.c"
# busybox's nc has no UDP mode (-u), which the node-to-pod UDP specs run: nc.c adds it.
gcc -static -O2 -o "$W/nc" "$here/nc.c" 2>/dev/null
# Busybox's sh drops variables whose names are no shell names (data-1) before it runs a
# command, and runs its own applets (nc) before anything on PATH; the real images' shells
# do neither. agnhost's stand-in, whose specs' commands look up nc, gets the host's bash
# as sh; busybox's keeps ash (the specs compare its messages) behind sh.c, which runs a
# one-command script directly with the whole environment.
gcc -static -O2 -o "$W/sh" "$here/sh.c"
f_busybox_sh() { rm -f $1/bin/sh; cp "$W/sh" $1/bin/sh; chmod 755 $1/bin/sh; }
f_bash_sh() { cp /bin/bash $1/bin/bash; ln -sf bash $1/bin/sh
  for lib in $(ldd /bin/bash | grep -o '/[^ ]*'); do mkdir -p "$1$(dirname "$lib")"; cp -L "$lib" "$1$lib"; done; }
base=$W/base; mkdir -p $base/{bin,etc,tmp,root,home,var/www,usr/bin,usr/sbin,sbin,usr/local/bin}
cp /bin/busybox $base/bin/busybox
for a in $(/bin/busybox --list); do [ -e $base/bin/$a ] || ln -s busybox $base/bin/$a; done
chmod 1777 $base/tmp
printf '%s\n' root:x:0:0:root:/root:/bin/sh daemon:x:1:1:daemon:/usr/sbin:/bin/false bin:x:2:2:bin:/bin:/bin/false \
  sys:x:3:3:sys:/dev:/bin/false www-data:x:33:33:www-data:/var/www:/bin/false nobody:x:65534:65534:nobody:/home:/bin/false > $base/etc/passwd
printf '%s\n' root:x:0: daemon:x:1: bin:x:2: sys:x:3: www-data:x:33: nogroup:x:65534: nobody:x:65534: > $base/etc/group
mk() { local ref=$1 fn=$2; shift 2; local d=$W/oci
  rm -rf $d $d.b; umoci init --layout $d; umoci new --image $d:t
  umoci unpack --image $d:t $d.b >/dev/null; cp -a $base/. $d.b/rootfs/; $fn $d.b/rootfs
  umoci repack --image $d:t $d.b
  umoci config --image $d:t --os linux --architecture $ARCH \
    --config.env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
  skopeo copy -q --dest-tls-verify=${DEST_TLS:-true} oci:$d:t docker://$REG/$ref; echo "pushed $REG/$ref"; }
f_none() { :; }
# the real agnhost image carries curl; the specs run `curl -g -q -s URL`: busybox wget stands in
f_agnhost() { cp "$AGNHOST" $1/agnhost; chmod 755 $1/agnhost; cp "$W/nc" $1/usr/local/bin/nc; f_bash_sh $1
  printf '#!/bin/sh\nfor a; do u=$a; done\nexec wget -q -O - "$u"\n' > $1/usr/local/bin/curl; chmod 755 $1/usr/local/bin/curl
  # it also carries bash (f_bash_sh) and a second copy of the binary (/agnhost-2, for entrypoint specs)
  cp "$AGNHOST" $1/agnhost-2
  # and a self-signed localhost pair for its HTTPS servers (`netexec --http-port ... --tls-*`)
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=localhost -keyout $1/localhost.key -out $1/localhost.crt 2>/dev/null; }
f_pause() { cp $W/pause $1/pause; }
f_nginx() { mkdir -p $1/usr/share/nginx/html; echo '<html><body>nginx stand-in (busybox httpd)</body></html>' > $1/usr/share/nginx/html/index.html; }
f_nnp() { cp $W/nnp $1/usr/local/bin/nnp; chmod 4755 $1/usr/local/bin/nnp; }
for t in 2.63.0 2.55; do mk e2e-test-images/agnhost:$t f_agnhost --config.entrypoint=/agnhost --config.cmd=pause; done
for t in 1.37.0-1 1.36.1-1; do mk e2e-test-images/busybox:$t f_busybox_sh --config.cmd=sh; done
mk pause:3.10.2 f_pause --config.entrypoint=/pause
for t in 1.27-0 1.15-4; do mk e2e-test-images/nginx:$t f_nginx --config.entrypoint=/bin/httpd --config.entrypoint=-f \
  --config.entrypoint=-p --config.entrypoint=80 --config.entrypoint=-h --config.entrypoint=/usr/share/nginx/html; done
mk e2e-test-images/nonewprivs:1.4 f_nnp --config.user=1000 --config.cmd=/usr/local/bin/nnp
mk e2e-test-images/nonroot:1.5 f_none --config.user=1234 --config.cmd=sh
# hostname and FQDN specs: the real image is glibc-based; busybox hostname stands in
mk e2e-test-images/glibc-dns-testing:2.0.0 f_none --config.cmd=sh
