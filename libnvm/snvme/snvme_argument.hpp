// The argument of an snvme ioctl (driver/snvme/include/uapi/snvme.h): every argument struct starts with
// `struct snvme_ioctl_hdr`, whose ABI version and size the driver checks before anything else
// (docs/driver.md). One place that fills it, for libnvm's SnvmeController and tuttid's PCI
// controllers. Include <uapi/snvme.h> first.
#pragma once

namespace tutti::libnvm {

/// A zeroed `T` (an snvme ioctl argument) with its header set: abi_version = SNVME_ABI_VERSION,
/// argsz = sizeof(T). Thread-safety: a pure function.
template <class T>
T snvme_argument() {
  T arg{};
  arg.hdr.abi_version = SNVME_ABI_VERSION;
  arg.hdr.argsz = sizeof(T);
  return arg;
}

}  // namespace tutti::libnvm
