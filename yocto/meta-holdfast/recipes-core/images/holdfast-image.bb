SUMMARY = "A small image that runs holdfast"
DESCRIPTION = "What oe-core's core-image-minimal boots with, plus packagegroup-holdfast: \
               the holdfast node agent, iptables, CA certificates and the overlay \
               module. A starting point for a gateway image, or a test image in qemu."
HOMEPAGE = "https://github.com/holdfast-agent/holdfast"
BUGTRACKER = "https://github.com/holdfast-agent/holdfast/issues"
SECTION = "images"
LICENSE = "MIT"
# An image: its packages are checked for CVEs, not the image itself.
CVE_PRODUCT = ""

# holdfast runs as a systemd unit, and the image's kernel needs the options of the
# layer's fragment (DISTRO_FEATURES "holdfast" applies it to linux-yocto).
REQUIRED_DISTRO_FEATURES = "systemd holdfast"

inherit core-image features_check

# core-image-minimal's contents (a console-only image that boots) and holdfast.
IMAGE_INSTALL = "packagegroup-core-boot packagegroup-holdfast ${CORE_IMAGE_EXTRA_INSTALL}"
IMAGE_LINGUAS = " "

# Room to pull and run a real pod: images are unpacked under /var/lib/holdfast, and
# core-image-minimal's rootfs leaves a few MiB free. 1 GiB beside what is installed
# (IMAGE_ROOTFS_EXTRA_SPACE is in KiB), and 1 GiB of RAM for runqemu (the agent, a shim
# per container and a small workload; the kernel's page cache for the image layers).
IMAGE_ROOTFS_EXTRA_SPACE = "1048576"
QB_MEM = "-m 1024"
