# Read only when meta-virtualization (collection virtualization-layer) is in the build
# (BBFILES_DYNAMIC in conf/layer.conf): its cni recipe installs the bridge, host-local,
# portmap and loopback plugins in /opt/cni/bin, which pods with a network of their own
# (not hostNetwork) need.
FILESEXTRAPATHS:prepend := "${THISDIR}/files:"

SRC_URI += "file://10-holdfast.conflist"

# holdfast's own default network (bridge holdfast0, host-local addresses from
# 10.88.0.0/16 kept under holdfast.rootDir, portmap for hostPort), as a file in
# /etc/cni/net.d that a site can edit; holdfast writes the same network under its
# root dir when the directory has none.
do_install:append() {
    install -d ${D}${sysconfdir}/cni/net.d
    install -m 0644 ${UNPACKDIR}/10-holdfast.conflist ${D}${sysconfdir}/cni/net.d/10-holdfast.conflist
}

CONFFILES:${PN} += "${sysconfdir}/cni/net.d/10-holdfast.conflist"

RRECOMMENDS:${PN} += "cni"
