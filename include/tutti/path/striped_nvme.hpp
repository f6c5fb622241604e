// The striped_nvme DataPath (front header): tutti::striped_nvme::StripedNvmeDataPath, striped_file
// targets over N NVMe controllers with one fused launch per submit. See
// path/striped_nvme/data_path.hpp and docs/striping.md.
#pragma once

#include <tutti/bind/striped_file.hpp>
#include <tutti/path/striped_nvme/data_path.hpp>
