//! keelson-image: the appliance image (initramfs, kernel modules, bootable disk, qcow2).
