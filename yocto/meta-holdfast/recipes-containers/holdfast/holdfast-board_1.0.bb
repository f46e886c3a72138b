SUMMARY = "The holdfast board profile for this MACHINE"
DESCRIPTION = "Names the board profile (reservations, eviction thresholds, log sizes, \
               node labels for a board family) that holdfast runs with on this \
               MACHINE, in a drop-in of holdfast's unit. The profiles are compiled \
               into holdfast, which is built once per architecture; only this small \
               package differs from MACHINE to MACHINE."
HOMEPAGE = "https://github.com/holdfast-agent/holdfast"
BUGTRACKER = "https://github.com/holdfast-agent/holdfast/issues"
SECTION = "admin"
LICENSE = "Apache-2.0"
# nooelint: oelint.var.licenseremotefile - the package holds two lines of our own
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/Apache-2.0;md5=89aea4e17d99a7cacdbeed46a0096b10"
# Nothing is fetched: do_install writes the drop-in.
SRC_URI = ""
# A choice of configuration, not software of its own.
CVE_PRODUCT = ""

# holdfast's unit is a systemd unit, as the holdfast recipe requires.
REQUIRED_DISTRO_FEATURES = "systemd"

inherit features_check

# The profile of each MACHINE whose board/<name>.yaml names it as yoctoMachine; none for
# other machines. A distro or image sets HOLDFAST_BOARD to pick another profile, or ""
# for none (holdfast's own defaults).
HOLDFAST_BOARD_MACHINES ?= "qemuarm64:arm64-vm imx8mq-evk:imx8m raspberrypi3:rpi3-armv7 raspberrypi4-64:rpi4"
HOLDFAST_BOARD ?= "${@holdfast_board_for_machine(d)}"

def holdfast_board_for_machine(d):
    machine = d.getVar('MACHINE')
    for pair in (d.getVar('HOLDFAST_BOARD_MACHINES') or '').split():
        name, _, board = pair.partition(':')
        if name == machine:
            return board
    return ''

PACKAGE_ARCH = "${MACHINE_ARCH}"
INHIBIT_DEFAULT_DEPS = "1"
do_configure[noexec] = "1"
do_compile[noexec] = "1"

do_install() {
    if [ -n "${HOLDFAST_BOARD}" ]; then
        install -d ${D}${systemd_system_unitdir}/holdfast.service.d
        printf '%s\n' '[Service]' 'Environment=HOLDFAST_ARGS=--board ${HOLDFAST_BOARD}' \
            > ${D}${systemd_system_unitdir}/holdfast.service.d/board.conf
        chmod 0644 ${D}${systemd_system_unitdir}/holdfast.service.d/board.conf
    fi
}

FILES:${PN} += "${systemd_system_unitdir}/holdfast.service.d"
# A MACHINE without a profile: an empty package, so that images install it alike.
ALLOW_EMPTY:${PN} = "1"
RDEPENDS:${PN} = "holdfast"

# A MACHINE's choice: no native or nativesdk variant.
BBCLASSEXTEND = ""
