SUMMARY = "Kubernetes node agent for small ARM gateways whose uplink comes and goes"
DESCRIPTION = "holdfast does the kubelet's job in one small binary: it runs pods \
               through youki's libcontainer, keeps its state in a sled database so \
               that a site keeps running its pods while offline and across power \
               cuts, and reports to the kube-apiserver whenever the uplink is there."
HOMEPAGE = "https://github.com/holdfast-agent/holdfast"
BUGTRACKER = "https://github.com/holdfast-agent/holdfast/issues"
SECTION = "admin"
# holdfast's Apache-2.0 and the licences of the crates linked in. holdfast-crates.inc,
# generated from Cargo.lock, sets HOLDFAST_LICENSE and HOLDFAST_CRATES_LIC_FILES (the
# crates' own license files).
LICENSE = "${HOLDFAST_LICENSE}"
LIC_FILES_CHKSUM = "file://LICENSE;md5=3b83ef96387f14655fc854ddc3c6bd57 ${HOLDFAST_CRATES_LIC_FILES}"
CVE_PRODUCT = "holdfast"

# holdfast's default `seccomp` feature (seccompProfile, which Pod Security `restricted`
# asks for) links libseccomp.
DEPENDS += "libseccomp"

# Where holdfast's sources are fetched from: the repository (host and path, as in
# a git:// URL) and the fetcher's parameters. Point them at your mirror or fork in
# local.conf or a bbappend, e.g. HOLDFAST_GIT_REPO = "git@git.example.com/edge/holdfast.git"
# with HOLDFAST_GIT_PARAMS = "protocol=ssh;branch=main", and set SRCREV to the
# commit to build.
HOLDFAST_GIT_REPO ?= "github.com/holdfast-agent/holdfast.git"
HOLDFAST_GIT_PARAMS ?= "protocol=https;branch=main"

SRC_URI = "git://${HOLDFAST_GIT_REPO};${HOLDFAST_GIT_PARAMS} \
           file://holdfast.service \
           file://config.yaml \
           "
SRCREV = "176d5fe6799f1e0b59173095de774ec36e67e375"

require holdfast-crates.inc

inherit cargo cargo-update-recipe-crates systemd features_check

# The unit file is the only way the recipe starts the agent.
REQUIRED_DISTRO_FEATURES = "systemd"

# The default `seccomp` feature (seccompProfile) links the shared libseccomp from the
# sysroot: Yocto builds no static libraries by default.
export LIBSECCOMP_LINK_TYPE = "dylib"

# The release profile strips the binary; leave that to the packaging so that the
# debug symbols land in ${PN}-dbg and the already-stripped check passes.
export CARGO_PROFILE_RELEASE_STRIP = "none"

# libcontainer and libcgroups 0.7.0 do not build for 32-bit ARM as released. The
# source tree carries patches (-p1 from each crate's root) for them. The crate
# fetcher unpacks each crate into ${CARGO_VENDORING_DIRECTORY}/<name>-<version>/
# (${UNPACKDIR}/cargo_home/bitbake/) and lists no per-file checksums in its
# .cargo-checksum.json, so cargo builds the patched sources.
HOLDFAST_CRATES_32BIT = "libcontainer-0.7.0 libcgroups-0.7.0"

holdfast_patch_crates() {
    if [ "${TARGET_ARCH}" != "arm" ]; then
        return 0
    fi
    for crate in ${HOLDFAST_CRATES_32BIT}; do
        patchfile="${S}/cross/patches/${crate}-32bit.patch"
        cratedir="${CARGO_VENDORING_DIRECTORY}/${crate}"
        [ -f "$patchfile" ] || bbfatal "$patchfile is missing"
        [ -d "$cratedir" ] || bbfatal "$crate is not unpacked in $cratedir: is it still in Cargo.lock?"
        # do_patch can run again on an unpacked tree: skip a patch already applied.
        if patch -p1 -R --dry-run -s -f -d "$cratedir" -i "$patchfile" >/dev/null 2>&1; then
            bbnote "$crate: already patched"
            continue
        fi
        bbnote "$crate: applying $patchfile"
        patch -p1 --fuzz=0 --no-backup-if-mismatch -d "$cratedir" -i "$patchfile"
    done
}
holdfast_patch_crates[doc] = "Applies the 32-bit ARM patches to the unpacked libcontainer and libcgroups crates"
do_patch[postfuncs] += "holdfast_patch_crates"

# A gateway that joins its cluster by itself carries a bootstrap kubeconfig (the
# cluster's server and CA and a bootstrap token; see the README's "Joining with a
# bootstrap token"). Name a file the fetcher finds, from a bbappend of your own layer:
#   FILESEXTRAPATHS:prepend := "${THISDIR}/files:"
#   SRC_URI += "file://bootstrap-kubeconfig"
#   HOLDFAST_BOOTSTRAP_KUBECONFIG = "bootstrap-kubeconfig"
# It is installed 0600 as /etc/holdfast/bootstrap-kubeconfig and named by
# holdfast.bootstrapKubeconfig in the config. At first start the agent asks for its
# node certificate with it and writes the node's kubeconfig under holdfast.rootDir.
HOLDFAST_BOOTSTRAP_KUBECONFIG ?= ""

# The board profile (board/<name>.yaml in the source tree: reservations, eviction
# thresholds, log sizes, node labels for a board family) the image ships: installed
# in ${datadir}/holdfast/boards and named by holdfast.board in the config. By default
# the one whose yoctoMachine is MACHINE; none for other machines. A distro or image
# sets HOLDFAST_BOARD to pick another profile, or "" for none.
HOLDFAST_BOARD_MACHINES ?= "qemuarm64:arm64-vm imx8mq-evk:imx8m raspberrypi3:rpi3-armv7 raspberrypi4-64:rpi4"
HOLDFAST_BOARD ?= "${@holdfast_board_for_machine(d)}"
# With a profile the package differs from machine to machine: it is built per MACHINE.
PACKAGE_ARCH = "${@'${MACHINE_ARCH}' if d.getVar('HOLDFAST_BOARD') else '${TUNE_PKGARCH}'}"

def holdfast_board_for_machine(d):
    machine = d.getVar('MACHINE')
    for pair in (d.getVar('HOLDFAST_BOARD_MACHINES') or '').split():
        name, _, board = pair.partition(':')
        if name == machine:
            return board
    return ''

do_install:append() {
    install -d ${D}${systemd_system_unitdir}
    install -m 0644 ${UNPACKDIR}/holdfast.service ${D}${systemd_system_unitdir}/holdfast.service
    sed -i -e 's,/usr/bin/,${bindir}/,g' -e 's,/etc/,${sysconfdir}/,g' \
        ${D}${systemd_system_unitdir}/holdfast.service

    install -d ${D}${sysconfdir}/holdfast
    install -m 0644 ${UNPACKDIR}/config.yaml ${D}${sysconfdir}/holdfast/config.yaml
    if [ -n "${HOLDFAST_BOOTSTRAP_KUBECONFIG}" ]; then
        install -m 0600 ${UNPACKDIR}/${HOLDFAST_BOOTSTRAP_KUBECONFIG} \
            ${D}${sysconfdir}/holdfast/bootstrap-kubeconfig
        sed -i -e 's,^  # bootstrapKubeconfig: .*,  bootstrapKubeconfig: ${sysconfdir}/holdfast/bootstrap-kubeconfig,' \
            ${D}${sysconfdir}/holdfast/config.yaml
    fi
    if [ -n "${HOLDFAST_BOARD}" ]; then
        [ -f "${S}/board/${HOLDFAST_BOARD}.yaml" ] || \
            bbfatal "HOLDFAST_BOARD is ${HOLDFAST_BOARD}, but ${S}/board/${HOLDFAST_BOARD}.yaml does not exist"
        install -d ${D}${datadir}/holdfast/boards
        install -m 0644 ${S}/board/${HOLDFAST_BOARD}.yaml ${D}${datadir}/holdfast/boards/
        sed -i -e 's,^  # board: .*,  board: ${HOLDFAST_BOARD},' \
            ${D}${sysconfdir}/holdfast/config.yaml
    fi
    install -d ${D}${sysconfdir}/kubernetes/manifests
    # The store caches secrets for offline use: only root may look inside.
    install -d -m 0700 ${D}${localstatedir}/lib/holdfast
}

SYSTEMD_SERVICE:${PN} = "holdfast.service"

CONFFILES:${PN} = "${sysconfdir}/holdfast/config.yaml"

# Pods need overlayfs for their root filesystems. A recommendation, not a
# dependency: kernels that build it in (as holdfast.cfg does) have no module
# package for it.
RRECOMMENDS:${PN} += "kernel-module-overlay"

# Pods with a network of their own (not hostNetwork) are wired by CNI plugins (bridge,
# host-local, portmap, loopback), and portmap's and the bridge's rules need iptables.
# Recommended, not required: a gateway that runs only hostNetwork pods needs neither.
# The plugins come from meta-virtualization's cni recipe: with that layer,
# dynamic-layers/virtualization-layer/ adds the recommendation and a default network.
RRECOMMENDS:${PN} += "iptables"

# A node agent for the target only: no native or nativesdk variant.
BBCLASSEXTEND = ""
