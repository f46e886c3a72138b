# The kernel options holdfast needs (linux-yocto/holdfast.cfg), for distros that ask
# for them with DISTRO_FEATURES:append = " holdfast". Without the feature this file
# changes nothing, so adding the layer alone leaves the kernel as it was.
require ${@bb.utils.contains('DISTRO_FEATURES', 'holdfast', 'linux-yocto-holdfast.inc', '', d)}
