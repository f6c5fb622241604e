# Sourced (not run) by the scripts that build and measure the cuda profile on a GPU machine:
# tests/gpu/run-on-gpu-machine.sh, bench/uring/run-on-gpu-machine.sh, bench/tool/gpu-figures.sh.
#
#   . scripts/gpu-machine-env.sh [DEBS_DIR]     # DEBS_DIR default: .deb
#
# 1. Puts nvcc on PATH (/usr/local/cuda/bin).
# 2. When pkg-config cannot find the build's dependencies (a GPU machine without network, without
#    liburing, ...), unpacks every Debian package of DEBS_DIR into a private prefix (/tmp/tutti-deps,
#    never into /) and points pkg-config, CMake and the loader at it. Fetch the packages on a Debian 12
#    machine with network: `apt-get download liburing-dev liburing2 liburiparser-dev liburiparser1
#    libfmt-dev libfmt9 nlohmann-json3-dev doctest-dev libbenchmark-dev libbenchmark1debian
#    libcli11-dev libxxhash-dev libxxhash0 liblmdb-dev liblmdb0 pkgconf-bin libpkgconf3` (docs/gpu.md).
# 3. Defines tutti_provide_udev_record DIR: cuFile (libcufile 1.15), even in compat mode, looks up the
#    block device of every file in the udev database and refuses the file when the record is missing
#    (cufile.log: "udev property not found: ID_FS_USAGE"), as on VMs and containers without udevd.
#    The function writes the record udev itself would write for the device holding DIR, only when
#    none exists (it never overwrites one). It changes the machine: call it only on a throwaway
#    benchmark machine, never on a host whose udev database you care about.
export PATH=/usr/local/cuda/bin:$PATH
tutti_debs=${1:-.deb}
if ! pkg-config --exists liburing liburiparser fmt nlohmann_json libxxhash lmdb CLI11 2>/dev/null && [ -d "$tutti_debs" ]; then
  tutti_prefix=/tmp/tutti-deps
  mkdir -p "$tutti_prefix"
  for f in "$tutti_debs"/*.deb; do dpkg -x "$f" "$tutti_prefix"; done
  # Debian's .pc files name /usr: point them into the prefix.
  find "$tutti_prefix" -name '*.pc' -exec sed -i "s|=/usr|=$tutti_prefix/usr|g" {} +
  export PKG_CONFIG_PATH=$tutti_prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$tutti_prefix/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export CMAKE_PREFIX_PATH=$tutti_prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export LD_LIBRARY_PATH=$tutti_prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # The prefix's headers are system headers, as they are in /usr/include on Debian: GCC then ignores the
  # -I pkg-config gives for the same folder and reports no warnings from inside fmt (GCC 13 finds
  # -Wdangling-reference and -Warray-bounds false positives in fmt 9, fatal under -Dwerror=true).
  export CPLUS_INCLUDE_PATH=$tutti_prefix/usr/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}
  export C_INCLUDE_PATH=$tutti_prefix/usr/include${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}
  # No pkg-config on the machine: use the carried pkgconf (meson reads $PKG_CONFIG).
  if ! command -v pkg-config >/dev/null && [ -x "$tutti_prefix/usr/bin/pkgconf" ]; then
    export PKG_CONFIG=$tutti_prefix/usr/bin/pkgconf
  fi
  echo "dependencies from $tutti_debs unpacked into $tutti_prefix"
fi

tutti_provide_udev_record() {
  local dir=$1 source device dev record
  source=$(findmnt -no SOURCE -T "$dir") || return 1
  device=$(basename "$source")
  dev=$(cat "/sys/class/block/$device/dev" 2>/dev/null) || { echo "no block device for $dir ($source)"; return 1; }
  record=/run/udev/data/b$dev
  if [ -e "$record" ]; then echo "udev record $record exists: left as is"; return 0; fi
  mkdir -p /run/udev/data
  printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\nE:ID_FS_UUID=%s\nE:DEVTYPE=disk\n' \
    "$(findmnt -no FSTYPE -T "$dir")" "$(blkid -s UUID -o value "$source" 2>/dev/null)" >"$record"
  echo "wrote udev record $record for $source (cuFile needs it; see scripts/gpu-machine-env.sh)"
}

# tutti_make_venv PYTHON DIR: a virtual environment at DIR that also sees every package PYTHON sees
# (torch, transformers, nanobind). --system-site-packages alone is not enough where PYTHON is itself a
# virtual environment's interpreter: the new one would see the base interpreter's site-packages only. A
# .pth file appends PYTHON's site-packages after the new environment's own, so carried wheels win.
tutti_make_venv() {
  local python=$1 venv=$2 site
  "$python" -m venv --system-site-packages "$venv" || return 1
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 1
  "$python" -c 'import site; print("\n".join(site.getsitepackages()))' >"$site/tutti-parent-site-packages.pth"
}
