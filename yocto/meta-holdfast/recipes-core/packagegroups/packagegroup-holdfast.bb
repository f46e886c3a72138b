SUMMARY = "holdfast and what a gateway running it needs"
DESCRIPTION = "The holdfast node agent and its board profile for the MACHINE, \
               iptables for the pod network's NAT and \
               hostPort rules, CA certificates for pulling images and reaching the \
               kube-apiserver over TLS, and the overlay module where the kernel \
               builds overlayfs as a module. Add it to an image with \
               IMAGE_INSTALL:append, as the layer's README shows."
HOMEPAGE = "https://github.com/holdfast-agent/holdfast"
BUGTRACKER = "https://github.com/holdfast-agent/holdfast/issues"
SECTION = "admin"
LICENSE = "MIT"

# holdfast's unit needs systemd, as the holdfast recipe does.
REQUIRED_DISTRO_FEATURES = "systemd"

inherit packagegroup features_check

RDEPENDS:${PN} = " \
    ca-certificates \
    holdfast \
    holdfast-board \
    iptables \
"

# A kernel that builds overlayfs in (as holdfast.cfg asks) has no module package.
RRECOMMENDS:${PN} = " \
    kernel-module-overlay \
"
