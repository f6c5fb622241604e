#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# QEMU rig for the snvme driver (docs/driver.md, "The QEMU rig").
#
# For each Debian kernel line (bookworm 6.1, bookworm-backports 6.12) this
# fetches the kernel image and headers as packages, builds driver/snvme
# against the headers (with its fault injection: SNVME_FAULT_INJECTION=1),
# builds the static guest programs (snvme-test, libnvm-snvme-test, kv-store-snvme-test,
# local-nvme-snvme-test, tuttid, tuttictl, tuttid-snvme-test, the KV example layerwise_kv_overlap) and an
# initramfs, then boots qemu-system-x86_64
# (q35, emulated Intel IOMMU, emulated NVMe behind a pcie-root-port, a QMP
# socket) once per LBA format (512 and 4096 bytes; one each with
# TUTTI_QEMU_MATRIX=pairwise) and runs
# tests/qemu/guest/suite.sh. When the guest prints TUTTI-HOTPLUG-REQUEST,
# the rig removes the NVMe with QMP device_del (the hot-removal test).
#
# Exit status: 0 when every guest test passed and no guest log holds
# "DMAR: [DMA", "BUG:", "WARNING:" or "Oops"; 1 otherwise; 77 only when the
# rig cannot run at all (not root, no x86-64 host).
#
# Environment:
#   TUTTI_CACHE_DIR       cache root (default /var/cache/tutti); this rig uses <root>/qemu
#   TUTTI_DEBIAN_MIRROR   Debian mirror (default http://deb.debian.org/debian)
#   TUTTI_QEMU_LINES      kernel lines to test (default "bookworm bookworm-backports")
#   TUTTI_QEMU_LBAS       LBA sizes in bytes (default "512 4096")
#   TUTTI_QEMU_MATRIX     full (default): every kernel line boots at every LBA size;
#                         pairwise: boot k (k = 0 .. max(lines, sizes) - 1) is line
#                         k mod lines at size k mod sizes, so every line and every
#                         size boots at least once: bookworm at 512, bookworm-backports
#                         at 4096 by default (.ci/run sets it: 2 boots instead of 4,
#                         each 60 to 90 s on 2 cores)
#   TUTTI_QEMU_TIMEOUT    seconds one guest may run before it is killed (default 900)
#   TUTTI_QEMU_INIT_TIMEOUT  seconds a guest may take to reach /init (default 180); a
#                         boot that hangs before it (no Tutti code has run yet: seen
#                         once as a TCG guest spinning after the kernel's MTRR
#                         messages) is killed and booted again, once
#   TUTTI_QEMU_SELFTEST   1 (default): also run the bad-DMA boot that must be caught
#   TUTTI_QEMU_SHUTDOWN   1 (default): also run the shutdown boot (last kernel line,
#                         LBA 4096): the controller bound and busy at poweroff -f, so the
#                         PCI shutdown hook runs; its console line, the kernel's power-down
#                         line and a clean log must follow
#   TUTTI_QEMU_NVP2P      1 (default): also build the module against nv-p2p.h from
#                         Debian non-free nvidia-kernel-source (build check only)
#   TUTTI_QEMU_KEEP       1: keep the work folder for inspection
#
# Usage: tests/qemu/run.sh [--expect-dmar]
#   --expect-dmar  run only the bad-DMA boot and succeed only if the rig
#                  detects the IOMMU fault (the negative control).
set -euo pipefail

readonly ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
readonly CACHE=${TUTTI_CACHE_DIR:-/var/cache/tutti}/qemu
readonly MIRROR=${TUTTI_DEBIAN_MIRROR:-http://deb.debian.org/debian}
readonly LINES=${TUTTI_QEMU_LINES:-bookworm bookworm-backports}
readonly LBAS=${TUTTI_QEMU_LBAS:-512 4096}
readonly MATRIX=${TUTTI_QEMU_MATRIX:-full}
readonly GUEST_TIMEOUT=${TUTTI_QEMU_TIMEOUT:-900}
readonly INIT_TIMEOUT=${TUTTI_QEMU_INIT_TIMEOUT:-180}
readonly HUNG_BEFORE_INIT=125  # boot's status when the guest never reached /init
readonly SELFTEST=${TUTTI_QEMU_SELFTEST:-1}
readonly SHUTDOWN=${TUTTI_QEMU_SHUTDOWN:-1}
readonly NVP2P=${TUTTI_QEMU_NVP2P:-1}
readonly FORBIDDEN='DMAR: \[DMA|BUG:|WARNING:|Oops'
# Every normal boot must report each of these as PASS: a test that silently
# did not run fails the rig.
readonly EXPECTED_TESTS=(param-range no-grab-on-load bind perms queue-flush-fua info
	bad-ioctl seal revoke dma-map-mmap-revoke ring-mmap-destroy-revoke load-ext4 mkfs-mount-write fiemap-read fiemap-write wrap
	libnvm-snvme-controller local-nvme-snvme kv-store-snvme kill-9-mid-io leaks-after-kill close-with-queues-live
	leaks-after-close umount-fsck rebind-50 remount-after-rebind controller-failure
	close-waits-for-fail-disable close-waits-for-stuck-reset-disable leaks-final tuttid-bind-mount tuttid-lease-io tuttid-seal tuttid-kv-example tuttid-kv-example-corrupt
	tuttid-kill-mid-io leaks-after-tuttid-kill tuttid-reset tuttid-restart-adopt tuttid-submit-after-revoke
	tuttid-verified-stop tuttid-sigterm tuttid-two-at-once bind-after-tuttid ladder-setup timeout-poll timeout-abort-reset timeout-fail
	reset-revoke
	libnvm-reset local-nvme-reset leaks-after-reset ladder-fsck hot-removal)

# check_matrix: TUTTI_QEMU_MATRIX, TUTTI_QEMU_LINES and TUTTI_QEMU_LBAS are
# usable (a list that names nothing would boot nothing and pass).
check_matrix() {
	local lines sizes size
	read -ra lines <<<"$LINES"
	read -ra sizes <<<"$LBAS"
	[[ $MATRIX == full || $MATRIX == pairwise ]] ||
		die "TUTTI_QEMU_MATRIX is '$MATRIX': must be full or pairwise"
	((${#lines[@]} > 0)) || die "TUTTI_QEMU_LINES is empty: name at least one kernel line"
	((${#sizes[@]} > 0)) || die "TUTTI_QEMU_LBAS is empty: name at least one LBA size"
	for size in "${sizes[@]}"; do
		[[ $size == 512 || $size == 4096 ]] || die "TUTTI_QEMU_LBAS has '$size': sizes are 512 or 4096"
	done
}

# lbas_of_line N: the LBA sizes the N-th kernel line (from 0) boots at.
lbas_of_line() {
	local lines sizes k out=()
	read -ra lines <<<"$LINES"
	read -ra sizes <<<"$LBAS"
	if [[ $MATRIX == full ]]; then
		echo "${sizes[@]}"
		return
	fi
	local boots=$((${#lines[@]} > ${#sizes[@]} ? ${#lines[@]} : ${#sizes[@]}))
	for ((k = $1; k < boots; k += ${#lines[@]})); do out+=("${sizes[$((k % ${#sizes[@]}))]}"); done
	echo "${out[@]}"
}

MODE=normal
case "${1:-}" in
"") ;;
--expect-dmar) MODE=expect-dmar ;;
*) echo "usage: $0 [--expect-dmar]" >&2; exit 2 ;;
esac

log() { printf '[qemu-rig %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "FATAL: $*"; exit 1; }

if [[ $(id -u) -ne 0 ]]; then
	log "needs root (apt-get, module builds in the cache); skipping"
	exit 77
fi
if [[ $(uname -m) != x86_64 ]]; then
	log "needs an x86-64 host; skipping"
	exit 77
fi

# --- host packages -----------------------------------------------------------
readonly HOST_PKGS=(qemu-system-x86 qemu-utils busybox-static cpio kmod pahole
	e2fsprogs make gcc gcc-12 g++ libc6-dev libfmt-dev libelf-dev bc flex bison xz-utils
	zstd dpkg-dev apt socat libcli11-dev nlohmann-json3-dev liburing-dev liburiparser-dev libxxhash-dev
	liblmdb-dev)

install_host_packages() {
	local missing=() p
	for p in "${HOST_PKGS[@]}"; do
		[[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true) == "install ok installed" ]] ||
			missing+=("$p")
	done
	((${#missing[@]} == 0)) && return 0
	log "installing host packages: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q >/dev/null || die "apt-get update failed"
	apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
		die "apt-get install ${missing[*]} failed"
}

# --- private apt configuration for kernel packages --------------------------
# Never touches the host's sources.list: lists, cache and state live under
# $CACHE/apt.
APT_OPTS=()
setup_apt() {
	local d=$CACHE/apt
	mkdir -p "$d/lists/partial" "$d/archives/partial" "$d/etc"
	cat >"$d/etc/sources.list" <<SRC
deb $MIRROR bookworm main non-free
deb $MIRROR bookworm-updates main non-free
deb ${MIRROR%/debian}/debian-security bookworm-security main non-free
deb $MIRROR bookworm-backports main non-free
SRC
	APT_OPTS=(-o "Dir::Etc::SourceList=$d/etc/sources.list"
		-o "Dir::Etc::SourceParts=$d/etc/none"
		-o "Dir::State::Lists=$d/lists"
		-o "Dir::Cache=$d/cache"
		-o "Dir::Cache::archives=$d/archives"
		-o "Dir::State::status=/dev/null"
		-o "APT::Get::List-Cleanup=0"
		-o "APT::Sandbox::User=root")
	mkdir -p "$d/etc/none" "$d/cache"
	# Refresh the lists at most every 6 hours: ABIs move when Debian updates.
	if [[ -z $(find "$d/lists" -maxdepth 1 -name '*Packages*' -mmin -360 2>/dev/null | head -1) ]]; then
		log "refreshing private apt lists"
		apt-get "${APT_OPTS[@]}" update -q >/dev/null || {
			# Offline: fall back to whatever the cache already holds.
			log "apt-get update failed; using cached lists if any"
		}
	fi
}

# Prints the versioned image package name for a line, e.g.
# linux-image-6.1.0-57-amd64.
resolve_image() {
	local line=$1 spec=linux-image-amd64
	[[ $line == bookworm-backports ]] && spec=linux-image-amd64/bookworm-backports
	apt-cache "${APT_OPTS[@]}" depends "$spec" 2>/dev/null |
		awk '/Depends: linux-image-[0-9]/ && !found { print $2; found = 1 }'
}

# Fetches image + headers (amd64, common) + kbuild into $CACHE/debs/<abi>
# and unpacks them into $CACHE/kernels/<abi>. Prints the ABI.
fetch_kernel() {
	local line=$1 image abi hdr deps pkgs=() p spec_suffix=""
	image=$(resolve_image "$line")
	if [[ -z $image ]]; then
		# Offline with an empty list: reuse the newest cached ABI of the line.
		local pat='6.1.0-*'
		[[ $line == bookworm-backports ]] && pat='6.1[2-9]*'
		abi=$(cd "$CACHE/kernels" 2>/dev/null && ls -d $pat 2>/dev/null | sort -V | tail -1 || true)
		[[ -n $abi && -f $CACHE/kernels/$abi/.done ]] || die "cannot resolve linux-image-amd64 for $line"
		log "$line: offline, using cached $abi"
		echo "$abi"
		return 0
	fi
	abi=${image#linux-image-}
	abi=${abi%-amd64}
	if [[ -f $CACHE/kernels/$abi/.done ]]; then
		echo "$abi"
		return 0
	fi
	[[ $line == bookworm-backports ]] && spec_suffix=/bookworm-backports
	hdr=linux-headers-$abi-amd64
	pkgs=("$image$spec_suffix" "$hdr$spec_suffix")
	deps=$(apt-cache "${APT_OPTS[@]}" depends "$hdr$spec_suffix" |
		awk '/Depends: linux-(headers|kbuild)-/ { print $2 }' | sort -u)
	for p in $deps; do pkgs+=("$p$spec_suffix"); done
	local debs=$CACHE/debs/$abi
	mkdir -p "$debs"
	log "$line: fetching ${pkgs[*]}"
	(cd "$debs" && apt-get "${APT_OPTS[@]}" download -q "${pkgs[@]}" >/dev/null)
	local k=$CACHE/kernels/$abi
	rm -rf "$k"
	mkdir -p "$k/root"
	for p in "$debs"/*.deb; do dpkg -x "$p" "$k/root"; done
	# The amd64 headers include the -common tree by absolute path.
	local hdir=$k/root/usr/src/linux-headers-$abi-amd64
	[[ -f $hdir/Makefile ]] || die "$abi: no headers Makefile in $hdir"
	sed -i "s|^include /usr/src/|include $k/root/usr/src/|" "$hdir/Makefile"
	# kbuild scripts are symlinks into /usr/lib/linux-kbuild-*: repoint them.
	local l t
	while IFS= read -r l; do
		t=$(readlink "$l")
		[[ $t == /* ]] && ln -sfn "$k/root$t" "$l"
	done < <(find "$k/root/usr/src" -type l)
	touch "$k/.done"
	echo "$abi"
}

# Unpacks nv-p2p.h from Debian non-free nvidia-kernel-source; prints the
# folder to pass as NVIDIA_SRC.
fetch_nvidia() {
	local d=$CACHE/nvidia
	if [[ ! -f $d/.done ]]; then
		rm -rf "$d"
		mkdir -p "$d/deb"
		log "fetching nvidia-kernel-source (non-free) for the nv-p2p build check"
		(cd "$d/deb" && apt-get "${APT_OPTS[@]}" download -q nvidia-kernel-source >/dev/null)
		dpkg-deb --fsys-tarfile "$d"/deb/nvidia-kernel-source_*.deb |
			tar -xO ./usr/src/nvidia-kernel.tar.xz |
			tar -xJ -C "$d" --wildcards '*/nvidia/nv-p2p.h'
		rm -rf "$d/deb"
		touch "$d/.done"
	fi
	dirname "$(dirname "$(find "$d" -path '*/nvidia/nv-p2p.h' -print -quit)")"
}

# --- builds --------------------------------------------------------------
# Work folder outside the repository; module builds copy the sources there.
WORK=
cleanup() {
	if [[ -n $WORK && ${TUTTI_QEMU_KEEP:-0} != 1 ]]; then
		rm -rf "$WORK"
	elif [[ -n $WORK ]]; then
		log "work folder kept: $WORK"
	fi
}

# build_module ABI [NVIDIA_SRC]: prints the path of snvme.ko. Without NVIDIA_SRC
# it is the module the guests load, with fault injection; with it, a build
# check in the production configuration (no fault injection).
build_module() {
	local abi=$1 nv=${2:-} k=$CACHE/kernels/$1/root
	local hdir=$k/usr/src/linux-headers-$abi-amd64 out=$WORK/mod-$abi${2:+-nvp2p}
	rm -rf "$out"
	mkdir -p "$out"
	cp -r "$ROOT/driver/snvme/." "$out/"
	local extra=(SNVME_FAULT_INJECTION=1)
	[[ -n $nv ]] && extra=(NVIDIA_SRC="$nv" KBUILD_MODPOST_WARN=1)
	if ! make -C "$hdir" M="$out" CC=gcc-12 -j2 W=1 "${extra[@]}" modules >"$out/build.log" 2>&1; then
		cat "$out/build.log" >&2
		die "$abi: module build failed"
	fi
	# Warnings count as failures: the driver must build clean on every line.
	if grep -E 'warning:|error:' "$out/build.log" | grep -v 'KBUILD_MODPOST_WARN\|undefined!' >&2; then
		die "$abi: module build has warnings"
	fi
	echo "$out/snvme.ko"
}

build_guest_programs() {
	mkdir -p "$WORK/bin"
	gcc -std=gnu11 -O2 -Wall -Wextra -Werror -static -pthread -I "$ROOT/driver/snvme/include" -o "$WORK/bin/snvme-test" \
		"$ROOT/tests/qemu/guest/snvme-test.c" "$ROOT/tests/qemu/guest/uq.c"
	bash "$ROOT/tests/qemu/guest/build-libnvm.sh" "$ROOT" "$WORK/bin"
	bash "$ROOT/tests/qemu/guest/build-tuttid.sh" "$ROOT" "$WORK/bin"
}

# copy_with_libs ROOTFS BINARY...: copies binaries and the libraries ldd names.
copy_with_libs() {
	local rootfs=$1 b l
	shift
	for b in "$@"; do
		install -D -m 0755 "$b" "$rootfs/sbin/$(basename "$b")"
		for l in $(ldd "$b" | grep -o '/[^ ]*'); do
			[[ -e $rootfs$l ]] || { mkdir -p "$rootfs$(dirname "$l")"; cp -L "$l" "$rootfs$l"; }
		done
	done
}

# build_initramfs ABI KO: prints the path of the cpio archive.
build_initramfs() {
	local abi=$1 ko=$2 kv=$1-amd64 k=$CACHE/kernels/$1/root
	local r=$WORK/initramfs-$abi out=$WORK/initramfs-$abi.cpio.gz a m
	rm -rf "$r"
	mkdir -p "$r"/{bin,sbin,lib,etc,proc,sys,dev,mnt,tmp}
	cp /bin/busybox "$r/bin/busybox"
	for a in $(/bin/busybox --list); do
		[[ $a == busybox ]] || ln -sf busybox "$r/bin/$a"
	done
	copy_with_libs "$r" "$(command -v mke2fs)" "$(command -v e2fsck)" "$WORK/bin/kv-store-snvme-test" \
		"$WORK/bin/layerwise_kv_overlap"
	ln -sf mke2fs "$r/sbin/mkfs.ext4"
	cp /etc/mke2fs.conf "$r/etc/"
	install -m 0644 "$ko" "$r/lib/snvme.ko"
	install -m 0755 "$WORK"/bin/* "$r/bin/"
	# ext4 and its dependencies, decompressed, in load order.
	depmod -b "$k" "$kv"
	: >"$r/lib/modules.load"
	modprobe --show-depends -d "$k" -S "$kv" ext4 | awk '/^insmod/ { print $2 }' |
		while read -r m; do
			local name
			name=$(basename "${m%.xz}")
			case $m in
			*.xz) xz -dc "$m" >"$r/lib/$name" ;;
			*) cp "$m" "$r/lib/$name" ;;
			esac
			grep -qx "/lib/$name" "$r/lib/modules.load" || echo "/lib/$name" >>"$r/lib/modules.load"
		done
	install -m 0755 "$ROOT/tests/qemu/guest/suite.sh" "$r/init"
	(cd "$r" && find . | cpio -o -H newc --quiet | gzip -1) >"$out"
	echo "$out"
}

# --- guest runs ------------------------------------------------------------
# qmp_device_del SOCKET ID LOG: removes device ID through QEMU's QMP socket
# (capabilities negotiation, then device_del); appends QMP's replies to LOG.
# Succeeds when both commands returned {"return": {}}.
qmp_device_del() {
	local sock=$1 id=$2 logf=$3 reply
	reply=$({
		printf '%s\n' '{"execute":"qmp_capabilities"}' \
			"{\"execute\":\"device_del\",\"arguments\":{\"id\":\"$id\"}}"
		sleep 2
	} | timeout 10 socat - "UNIX-CONNECT:$sock" 2>&1) || true
	printf 'TUTTI-QMP %s\n' "$reply" >>"$logf.qmp"
	[[ $(grep -c '"return": {}' <<<"$reply") -ge 2 ]]
}

# boot ABI INITRD LBA MODE LOG: runs one guest; returns qemu's status, or
# HUNG_BEFORE_INIT when the guest's /init (suite.sh, which prints TUTTI-INIT
# first) had not started after INIT_TIMEOUT seconds (then qemu is killed) or
# never started at all. no_timer_check: under TCG on a loaded host the
# kernel's early IO-APIC timer check can miss its window and panic ("timer
# doesn't work through Interrupt-remapped IO-APIC", seen once on 6.1).
# The NVMe (id nvme0) sits behind a pcie-root-port so that it can be removed;
# a guest line TUTTI-HOTPLUG-REQUEST makes the rig remove it, once.
boot() {
	local abi=$1 initrd=$2 lba=$3 mode=$4 logf=$5
	local disk=$WORK/disk-$abi-$lba-$mode.img qmp=$WORK/qmp-$abi-$lba-$mode.sock
	local vmlinuz=$CACHE/kernels/$abi/root/boot/vmlinuz-$abi-amd64
	# The log too: a previous run's TUTTI-HOTPLUG-REQUEST must not trigger a removal before this guest asks.
	rm -f "$disk" "$qmp" "$logf" "$logf.qmp"
	truncate -s 256M "$disk"
	local rc=0
	timeout --kill-after=10 "$GUEST_TIMEOUT" qemu-system-x86_64 \
		-machine q35 -m 1G -smp 2 -nographic -no-reboot -net none -vga none \
		-device intel-iommu,intremap=on \
		-qmp "unix:$qmp,server=on,wait=off" \
		-kernel "$vmlinuz" -initrd "$initrd" \
		-append "console=ttyS0 panic=-1 loglevel=5 intel_iommu=on iommu.strict=1 no_timer_check tutti.lba=$lba tutti.mode=$mode" \
		-drive "file=$disk,if=none,id=nvm,format=raw,cache=unsafe" \
		-device pcie-root-port,id=rp0,bus=pcie.0,chassis=1,slot=1 \
		-device "nvme,id=nvme0,bus=rp0,serial=deadbeef,drive=nvm,logical_block_size=$lba,physical_block_size=$lba" \
		</dev/null >"$logf" 2>&1 &
	local qemu=$! waited=0 removed=0
	while kill -0 "$qemu" 2>/dev/null; do
		if ((waited >= INIT_TIMEOUT)) && ! grep -aq 'TUTTI-INIT' "$logf"; then
			kill "$qemu" 2>/dev/null  # timeout(1) passes the signal on to qemu
			wait "$qemu" 2>/dev/null
			rm -f "$disk" "$qmp"
			return $HUNG_BEFORE_INIT
		fi
		if ((!removed)) && grep -saq 'TUTTI-HOTPLUG-REQUEST nvme0' "$logf"; then
			removed=1
			if qmp_device_del "$qmp" nvme0 "$logf"; then
				log "$abi, LBA $lba: guest asked for hot removal: QMP device_del nvme0 sent"
			else
				log "$abi, LBA $lba: QMP device_del failed: $(tr '\n' ' ' <"$logf.qmp")"
			fi
		fi
		sleep 1
		waited=$((waited + 1))
	done
	wait "$qemu" || rc=$?
	rm -f "$disk" "$qmp"
	# Ended before /init (a panic in early boot): no Tutti code ran either.
	grep -aq 'TUTTI-INIT' "$logf" || return $HUNG_BEFORE_INIT
	return $rc
}

# boot_retrying_hangs ARGS...: boot ARGS; a guest that hung or stopped before
# /init (no Tutti code ran) is booted once more. Returns the last boot's status.
boot_retrying_hangs() {
	local rc=0
	boot "$@" || rc=$?
	if ((rc == HUNG_BEFORE_INIT)); then
		log "$1, LBA $3, $4: the guest hung or stopped before /init (no Tutti code had run); booting it once more"
		rc=0
		boot "$@" || rc=$?
	fi
	return $rc
}

# verdict LOG [normal]: 0 if the suite passed and the log is clean; prints why not.
verdict() {
	local logf=$1 mode=${2:-} ok=0 summary t missing=()
	summary=$(grep -a 'TUTTI-SUITE' "$logf" | tail -1 | tr -d '\r')
	if [[ -z $summary ]]; then
		echo "no TUTTI-SUITE line: guest crashed, hung or timed out"
		ok=1
	elif [[ $summary != *" fail=0 "* ]]; then
		echo "failed tests: $(grep -a 'TUTTI-TEST .* FAIL' "$logf" | tr -d '\r' | awk '{ print $2 }' | tr '\n' ' ')"
		ok=1
	fi
	if [[ $mode == normal ]]; then
		for t in "${EXPECTED_TESTS[@]}"; do
			grep -aq "^TUTTI-TEST $t PASS" "$logf" || missing+=("$t")
		done
		if ((${#missing[@]})); then
			echo "tests without a PASS: ${missing[*]}"
			ok=1
		fi
	fi
	if grep -aE "$FORBIDDEN" "$logf" >/dev/null; then
		echo "guest log has: $(grep -aoE "$FORBIDDEN" "$logf" | sort | uniq -c | tr '\n' ' ')"
		ok=1
	fi
	return $ok
}

main() {
	check_matrix
	install_host_packages
	setup_apt
	mkdir -p "$CACHE"
	WORK=$(mktemp -d /tmp/tutti-qemu.XXXXXX)
	trap cleanup EXIT
	local line abi ko initrd lba logf failed=0 runs=0 start=$SECONDS
	local logs=$CACHE/logs
	mkdir -p "$logs"
	build_guest_programs
	local abis=()
	for line in $LINES; do
		abi=$(fetch_kernel "$line")
		abis+=("$abi")
		log "$line: kernel $abi"
	done
	local line_index=-1
	for abi in "${abis[@]}"; do
		line_index=$((line_index + 1))
		ko=$(build_module "$abi")
		log "$abi: built $(basename "$ko") ($(stat -c %s "$ko") bytes)"
		if [[ $NVP2P == 1 ]]; then
			local nvko
			nvko=$(build_module "$abi" "$(fetch_nvidia)")
			# No "nm | grep -q": with pipefail, nm's SIGPIPE would fail the check.
			[[ $(nm -u "$nvko") == *nvidia_p2p_get_pages* ]] ||
				die "$abi: nv-p2p build did not compile the GPU path"
			# It is also the production configuration: no fault injection in it.
			! grep -aq drop_completions "$nvko" ||
				die "$abi: a build without SNVME_FAULT_INJECTION=1 has the fault injection knobs"
			grep -aq drop_completions "$ko" ||
				die "$abi: the test build lacks the fault injection knobs"
			log "$abi: nv-p2p build OK (GPU DMA path compiled, no fault injection; not loadable here)"
		fi
		initrd=$(build_initramfs "$abi" "$ko")
		if [[ $MODE == normal ]]; then
			for lba in $(lbas_of_line $line_index); do
				logf=$logs/$abi-lba$lba.log
				log "$abi, LBA $lba: booting (log $logf)"
				local t0=$SECONDS why
				boot_retrying_hangs "$abi" "$initrd" "$lba" normal "$logf" || log "qemu exited with $?"
				runs=$((runs + 1))
				if why=$(verdict "$logf" normal); then
					log "$abi, LBA $lba: PASS ($(grep -ac 'TUTTI-TEST .* PASS' "$logf") tests, $((SECONDS - t0)) s)"
				else
					log "$abi, LBA $lba: FAIL: $why"
					{ grep -a 'TUTTI-TEST\|FAIL' "$logf" || true; } | tr -d '\r' | tail -40 >&2  # none: not fatal (set -e)
					failed=$((failed + 1))
				fi
			done
		fi
		# The shutdown hook, once (last kernel line): the guest powers off with the
		# controller bound, ext4 mounted and IO in flight; after TUTTI-SUITE the
		# console must show the hook's line (CSTS.RDY 0: the controller disabled)
		# and the kernel's "reboot: Power down", and qemu must exit by itself.
		if [[ $MODE == normal && $SHUTDOWN == 1 && $abi == "${abis[-1]}" ]]; then
			logf=$logs/$abi-shutdown.log
			log "$abi: shutdown boot (the controller busy at poweroff)"
			local t0=$SECONDS why rc=0
			boot_retrying_hangs "$abi" "$initrd" 4096 shutdown "$logf" || rc=$?
			runs=$((runs + 1))
			if ! why=$(verdict "$logf"); then
				log "shutdown boot: FAIL: $why"
				failed=$((failed + 1))
			elif ((rc != 0)); then
				log "shutdown boot: FAIL: qemu exited with $rc (124: killed at the timeout)"
				failed=$((failed + 1))
			elif ! grep -aq '^TUTTI-TEST busy-at-shutdown PASS' "$logf" ||
				! sed -n '/TUTTI-SUITE/,$p' "$logf" | grep -aq 'snvme0: stopped for system shutdown: CSTS.RDY 0' ||
				! sed -n '/TUTTI-SUITE/,$p' "$logf" | grep -aq 'reboot: Power down'; then
				log "shutdown boot: FAIL: no busy-at-shutdown PASS, no hook line with CSTS.RDY 0 or no power-down after TUTTI-SUITE"
				{ sed -n '/TUTTI-SUITE/,$p' "$logf" || true; } | tr -d '\r' | tail -20 >&2
				failed=$((failed + 1))
			else
				log "shutdown boot: PASS (hook ran with the controller busy, $((SECONDS - t0)) s)"
			fi
		fi
		# Negative control, once (first kernel line): a DMA to an unmapped IOVA
		# must be caught by the same verdict, and through the IOMMU log only.
		if [[ $MODE == expect-dmar || ($SELFTEST == 1 && $abi == "${abis[0]}") ]]; then
			logf=$logs/$abi-bad-dma.log
			log "$abi: negative control boot (bad DMA)"
			boot_retrying_hangs "$abi" "$initrd" 4096 bad-dma "$logf" || log "qemu exited with $?"
			runs=$((runs + 1))
			local why
			if why=$(verdict "$logf"); then
				log "negative control: FAIL: the verdict accepted a run with a bad DMA"
				failed=$((failed + 1))
			elif grep -aq 'DMAR: \[DMA Write' "$logf" &&
				grep -aq 'TUTTI-TEST bad-dma PASS' "$logf" &&
				grep -aq 'completed with status 0x0' "$logf"; then
				log "negative control: caught as expected ($why)"
			else
				log "negative control: FAIL: expected a DMAR write fault after a successful completion; verdict: $why"
				failed=$((failed + 1))
			fi
		fi
	done
	log "$runs guest runs, $failed failed, $((SECONDS - start)) s; logs in $logs"
	((failed == 0))
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
	main
fi
