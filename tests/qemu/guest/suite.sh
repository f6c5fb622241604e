#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
#
# /init of the snvme test guest (busybox sh). Kernel command line:
#   tutti.lba=<bytes>      LBA size QEMU was given, checked by "info"
#   tutti.mode=normal      the full suite
#   tutti.mode=bad-dma     only the negative control: a DMA to an unmapped IOVA
#   tutti.mode=shutdown    only bind, make the controller busy, power off (the shutdown hook)
# Prints "TUTTI-TEST <name> PASS|FAIL" per test, the kernel log between
# TUTTI-DMESG-BEGIN/END, then "TUTTI-SUITE pass=<n> fail=<m>", and powers off.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
echo "TUTTI-INIT started"  # the rig's sign that the kernel reached /init (tests/qemu/run.sh, boot)
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t debugfs debugfs /sys/kernel/debug
mkdir -p /mnt /tmp
mount -t tmpfs tmpfs /tmp

LBA=512
MODE=normal
for a in $(cat /proc/cmdline); do
	case $a in
	tutti.lba=*) LBA=${a#tutti.lba=} ;;
	tutti.mode=*) MODE=${a#tutti.mode=} ;;
	esac
done
PASS=0
FAIL=0
T=/bin/snvme-test

# t NAME CMD...: runs CMD with a deadline, records the verdict.
t() {
	name=$1
	shift
	echo "=== $name: $*"
	case $(type "$1") in
	*function*) set -- "$@" ;;	# shell steps: the rig's qemu timeout bounds them
	*) set -- timeout 300 "$@" ;;
	esac
	if "$@"; then
		echo "TUTTI-TEST $name PASS"
		PASS=$((PASS + 1))
	else
		echo "TUTTI-TEST $name FAIL (exit $?)"
		FAIL=$((FAIL + 1))
	fi
}

# The busy readers and the queue group of the shutdown boot and hot removal are ready.
all_ready() { [ -e /tmp/r-raw ] && [ -e /tmp/r-file ] && [ -e /tmp/r-queues ]; }

wait_for() {	# wait_for SECONDS TEST...: polls TEST every 0.1 s
	n=$(($1 * 10))
	shift
	while ! "$@"; do
		[ $n -gt 0 ] || return 1
		n=$((n - 1))
		sleep 0.1
	done
}

finish() {
	echo "TUTTI-DMESG-BEGIN"
	dmesg
	echo "TUTTI-DMESG-END"
	echo "TUTTI-SUITE pass=$PASS fail=$FAIL mode=$MODE lba=$LBA kernel=$(uname -r)"
	sync
	poweroff -f
}

# The emulated NVMe controller, by class code 0x010802.
ADDR=
for d in /sys/bus/pci/devices/*; do
	[ "$(cat $d/class)" = 0x010802 ] && ADDR=${d##*/}
done

no_grab() {
	[ -n "$ADDR" ] || { echo "no NVMe device (class 0x010802)"; return 1; }
	[ ! -e /sys/bus/pci/devices/$ADDR/driver ] || { echo "$ADDR bound on load"; return 1; }
	[ ! -e /dev/snvme0 ] || return 1
	echo "snvme loaded; $ADDR has no driver"
}

param_range() {
	# Out-of-range module parameters are refused at load with a message.
	if insmod /lib/snvme.ko kernel_queues=0 2>/dev/null; then
		echo "kernel_queues=0 accepted"; rmmod snvme; return 1
	fi
	if insmod /lib/snvme.ko user_queues=5000 2>/dev/null; then
		echo "user_queues=5000 accepted"; rmmod snvme; return 1
	fi
	dmesg | grep -q "kernel_queues=0 rejected: must be 1..64" || return 1
	dmesg | grep -q "user_queues=5000 rejected: must be 0..1024" || return 1
}

t param-range param_range
# max_retries=1 keeps the timeout ladder's last test at 2 tries (4 deadlines).
insmod /lib/snvme.ko kernel_queues=2 user_queues=20 max_retries=1 || echo "insmod failed"
t no-grab-on-load no_grab
t bind $T bind "$ADDR"

if [ "$MODE" = bad-dma ]; then
	t bad-dma $T bad-dma
	finish
fi

# System shutdown with the controller bound and busy (the PCI shutdown hook):
# ext4 mounted with a file being read, O_DIRECT reads of the disk and a
# userspace queue group with commands in flight, then poweroff -f, which runs
# every driver's shutdown hook. The rig checks the hook's line on the console
# after TUTTI-SUITE, the kernel's power-down line, and a clean log.
if [ "$MODE" = shutdown ]; then
	busy_at_shutdown() {
		while read -r m; do insmod "$m" 2>/dev/null; done </lib/modules.load
		mkfs.ext4 -F -q -b 4096 -E nodiscard /dev/snvme0n1 61440 || return 1
		mount -t ext4 /dev/snvme0n1 /mnt || return 1
		head -c 4194304 /dev/urandom >/mnt/busy && sync || return 1
		rm -f /tmp/r-*
		$T io-until-error /dev/snvme0n1 /tmp/r-raw &
		$T io-until-error /mnt/busy /tmp/r-file &
		$T removal-holder /tmp/r-queues &
		wait_for 120 all_ready || { echo "the I/O never got busy"; return 1; }
		echo "busy: raw reads, file IO and a queue group in flight"
	}
	t busy-at-shutdown busy_at_shutdown
	dmesg -n 8	# the hook's dev_info reaches the console during the power-off
	finish
fi

t perms $T perms "$ADDR"
queue_flags() {
	# Identify Controller VWC is set by QEMU: the disk must be write back with FUA.
	q=/sys/block/snvme0n1/queue
	echo "write_cache=$(cat $q/write_cache) fua=$(cat $q/fua) lbs=$(cat $q/logical_block_size) max_hw_sectors_kb=$(cat $q/max_hw_sectors_kb)"
	[ "$(cat $q/write_cache)" = "write back" ] && [ "$(cat $q/fua)" = 1 ] &&
		[ "$(cat $q/logical_block_size)" = "$LBA" ]
}
t queue-flush-fua queue_flags
t info $T info "$LBA" deadbeef
t bad-ioctl $T bad-ioctl
t seal $T seal
t revoke $T revoke
t dma-map-mmap-revoke $T dma-map-mmap-revoke
t ring-mmap-destroy-revoke $T ring-mmap-destroy-revoke

load_ext4() {
	# crc32c-intel needs SSE4.2, which the emulated CPU may lack: optional.
	while read -r m; do insmod "$m" 2>/dev/null; done </lib/modules.load
	grep -qw ext4 /proc/filesystems
}
t load-ext4 load_ext4

make_fs() {
	# 240 MiB of the 256 MiB namespace: the tail is scratch space for raw writes.
	mkfs.ext4 -F -q -b 4096 -E nodiscard /dev/snvme0n1 61440 || return 1
	mount -t ext4 /dev/snvme0n1 /mnt || return 1
	head -c 5000 /dev/urandom >/mnt/small
	head -c 1048576 /dev/urandom >/mnt/one-mib
	head -c 3145851 /dev/urandom >/mnt/three-mib
	mkdir /mnt/dir && cp /mnt/small /mnt/dir/copy
	sync
	md5sum /mnt/small /mnt/one-mib /mnt/three-mib >/tmp/sums
	cmp /mnt/small /mnt/dir/copy
}
t mkfs-mount-write make_fs
t fiemap-read $T fiemap-read /mnt/small /mnt/one-mib /mnt/three-mib
t fiemap-write $T fiemap-write /mnt/one-mib
t wrap $T wrap
t libnvm-snvme-controller /bin/libnvm-snvme-test "$LBA" $((245 * 1048576 / LBA))
# The local_nvme DataPath over SnvmeController: a hand-built file in the scratch tail from 248 MiB.
t local-nvme-snvme /bin/local-nvme-snvme-test "$LBA" $((248 * 1048576 / LBA))
# The KV block store over that DataPath: its layer files on the mounted ext4, resolved to LBAs
# with FIEMAP, written and read on user queues, verified, then recovered after a reopen.
t kv-store-snvme /bin/kv-store-snvme-test /mnt/kv-store

kill_mid_io() {
	rm -f /tmp/ready
	$T hold-io /tmp/ready &
	pid=$!
	i=0
	while [ ! -e /tmp/ready ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i + 1)); done
	[ -e /tmp/ready ] || { kill -9 $pid; echo "hold-io never got busy"; return 1; }
	kill -9 $pid
	wait $pid
	echo "killed hold-io (pid $pid) with commands in flight"
}
t kill-9-mid-io kill_mid_io
t leaks-after-kill $T leaks
t close-with-queues-live $T close-live
t leaks-after-close $T leaks

fs_check() {
	umount /mnt || return 1
	# The queue wrote new bytes into one-mib: it must differ from the old sum.
	e2fsck -fn /dev/snvme0n1 || return 1
}
t umount-fsck fs_check
t rebind-50 $T rebind "$ADDR" 50
remount() {
	mount -t ext4 /dev/snvme0n1 /mnt || return 1
	md5sum /mnt/small /mnt/three-mib >/tmp/sums2
	grep -v one-mib /tmp/sums | cmp - /tmp/sums2 || return 1
	cmp /mnt/small /mnt/dir/copy || return 1
	umount /mnt
}
t remount-after-rebind remount
t controller-failure $T fail "$ADDR"
t close-waits-for-fail-disable $T close-waits-for-disable "$ADDR" fail
t close-waits-for-stuck-reset-disable $T close-waits-for-disable "$ADDR" reset
t leaks-final $T leaks

# tuttid on this PCI controller (docs/daemon.md, "PCI controllers"): a real tuttid binds the controller
# through /dev/snvme-control, mounts the ext4 of mkfs-mount-write, leases sealed queue groups to client
# processes (tuttid-snvme-test: the local_nvme DataPath over LeasedController; the KV example with --backend nvme),
# reclaims the queues of a client killed mid-I/O, adopts the bound controller and the mount after a crash and
# revokes the leases of holders still alive, revokes leases whose holders go on submitting, leaves a mount it
# only verified (and the controller bound) at stop, and on SIGTERM unmounts what it mounted and unbinds.
TD=/tmp/tuttid
TSOCK=$TD/tuttid.sock
TC=/bin/tuttid-snvme-test
TSCRATCH=$((240 * 1048576 / LBA))  # 1 MiB after the file system, before the other tests' scratch
tuttid_up() { /bin/tuttictl --socket $TSOCK --json devices 2>/dev/null | grep -q '"state": *"up"'; }
tuttid_gone() { ! kill -0 $TPID 2>/dev/null; }
tuttid_up_or_gone() { tuttid_gone || tuttid_up; }
tuttid_start() {
	/bin/tuttid --config $TD/tuttid.json >>$TD/log 2>&1 &
	TPID=$!
	wait_for 30 tuttid_up_or_gone && tuttid_up || { echo "tuttid not up within 30 s"; cat $TD/log; return 1; }
	cat $TD/log
}
tuttid_bind_mount() {
	mkdir -p $TD
	# The controller is released first (sysfs), so that tuttid's BIND binds it.
	echo "$ADDR" >/sys/bus/pci/drivers/snvme/unbind || return 1
	wait_for 10 [ ! -e /dev/snvme0 ] || return 1
	cat >$TD/tuttid.json <<EOF
{ "socket": {"path": "$TSOCK"}, "state_file": "$TD/tuttid.state", "shutdown_grace_ms": 2000,
  "controllers": [{"name": "nvme0", "pci_address": "$ADDR", "io_queue_pairs": 6, "kernel_queues": 2,
                   "queue_depth": 64, "namespaces": [{"nsid": 1, "mount": "/mnt/./tuttid/", "filesystem": "ext4"}],
                   "accelerators": [0, 1], "client": {"max_queues": 4}}] }
EOF
	tuttid_start || return 1	# the mount point is written unnormalised: /mnt/tuttid in the kernel's table
	grep -q "bound PCI $ADDR to snvme" $TD/log || return 1
	grep -q "^/dev/snvme0n1 /mnt/tuttid ext4" /proc/mounts || { echo "/mnt/tuttid is not mounted"; return 1; }
	grep -q "nvme0 namespace 1: /dev/snvme0n1 on /mnt/tuttid (ext4, mounted)" $TD/log || return 1
	[ -d /mnt/tuttid/accelerator0 ] && [ -d /mnt/tuttid/accelerator1 ] || { echo "no accelerator directories"; return 1; }
	cmp /mnt/tuttid/small /mnt/tuttid/dir/copy
}
t tuttid-bind-mount tuttid_bind_mount
t tuttid-lease-io $TC io $TSOCK nvme0 "$LBA" $TSCRATCH
t tuttid-seal $TC seal $TSOCK nvme0
# The KV example as tuttid's client (docs/kv-cache.md, "--backend nvme through tuttid"): it leases 2 queues of
# nvme0, puts its layer files in its default folder on the namespace tuttid mounted, resolves them with FIEMAP to
# LBAs of /dev/snvme0n1 and moves every tensor through the leased queues; its pread baselines read the same files
# with O_DIRECT through the kernel's queues. 6 layers x 4 chunks x K and V of 64 KiB: 3 MiB.
KV="/bin/layerwise_kv_overlap --backend nvme --controller nvme0 --tuttid-socket $TSOCK --lease-queues 2 --layers 6
	--context-tokens 1024 --tokens-per-block 256 --tensor-bytes 65536 --repeat 1 --compute-ms 0.5 --no-drop-caches"
KVDATA=/mnt/tuttid/tutti-layerwise-kv
tuttid_kv_example() {
	rc=0
	timeout 120 $KV >/tmp/kv.out 2>&1 || rc=$?
	cat /tmp/kv.out
	[ $rc = 0 ] || { echo "the example exited $rc"; return 1; }
	# Per read pass (restore, pread, pread x6 = the 6 requests in flight, pipeline) 6 layers x 3 cached chunks x 2
	# tensors; written: 6 layers x 1 missed chunk x 2.
	grep -q "^  verify  *: 156 tensors checked (restore 36, pread 36, pread x6 36, pipeline 36, written 12; .*), 0 mismatched -> VERIFIED$" \
		/tmp/kv.out || { echo "no VERIFIED line of 156 tensors"; return 1; }
	grep -q "^  verdict  *: .*; every tensor verified (156)$" /tmp/kv.out || { echo "no verdict line"; return 1; }
	# Each request of the restore an NVMe command (local_nvme), on the queues tuttid says it leased to this run.
	grep -q "^  restore only  *: .* (36 requests, 36 device commands; " /tmp/kv.out || { echo "no restore line"; return 1; }
	grep -q "^  local_nvme  *: 0 NVMe commands sent again after a retryable status, 0 Aborts sent$" /tmp/kv.out ||
		{ echo "no local_nvme line"; return 1; }
	lease=$(sed -n 's|^  lease  *: lease \([0-9]*\) of tuttid on controller nvme0: 2 queues (IDs \([0-9]*,[0-9]*\)) of depth 64, namespace 1 (/dev/snvme0n1 on /mnt/tuttid)$|\1 \2|p' /tmp/kv.out)
	[ -n "$lease" ] || { echo "no lease line of 2 queues on /dev/snvme0n1"; return 1; }
	set -- $lease
	grep "lease $1 granted: pid [0-9]* uid 0 on nvme0, queues $2, " $TD/log || { echo "tuttid logged no lease $1 of queues $2"; return 1; }
	grep "lease $1 released: " $TD/log || { echo "tuttid logged no release of lease $1"; return 1; }
}
t tuttid-kv-example tuttid_kv_example
tuttid_kv_example_corrupt() {
	# Two bytes of layer 2, chunk 1, V (the store's layout: (2 x 1 + 1) x 64 KiB in) changed through ext4 and the
	# kernel's queues; the next run reads them through the leased queues: exit 1, the tensor named.
	printf '\xff\x00' | dd of=$KVDATA/layer-00002.kv bs=1 seek=$((3 * 65536 + 100)) conv=notrunc 2>/dev/null || return 1
	sync
	rc=0
	timeout 120 $KV --no-pread-baseline >/tmp/kv.out 2>&1 || rc=$?
	cat /tmp/kv.out
	[ $rc = 1 ] || { echo "a corrupted tensor gave exit $rc, expected 1"; return 1; }
	grep -q "^  verify  *: 84 tensors checked (restore 36, pipeline 36, written 12; .*), 2 mismatched -> FAILED$" \
		/tmp/kv.out || { echo "no FAILED line of 2 in 84 tensors"; return 1; }
	grep -q "did not match their checksums, first: restore layer 2 chunk 1 V" /tmp/kv.out ||
		{ echo "the mismatch is not named"; return 1; }
	rm -rf $KVDATA
}
t tuttid-kv-example-corrupt tuttid_kv_example_corrupt
tuttid_kill_mid_io() {
	rm -f /tmp/td-ready
	$TC hold $TSOCK nvme0 "$LBA" $TSCRATCH /tmp/td-ready &
	pid=$!
	wait_for 60 [ -e /tmp/td-ready ] || { kill -9 $pid; echo "the holder never got busy"; return 1; }
	kill -9 $pid
	$TC reclaim $TSOCK nvme0 4 || return 1
	wait $pid
	grep "reclaimed" $TD/log
}
t tuttid-kill-mid-io tuttid_kill_mid_io
t leaks-after-tuttid-kill $T leaks
tuttid_reset() {
	rm -f /tmp/td-leased
	$TC told $TSOCK nvme0 /tmp/td-leased &
	pid=$!
	wait_for 30 [ -e /tmp/td-leased ] || { kill -9 $pid; echo "no lease"; return 1; }
	echo 1 >/sys/kernel/debug/snvme/snvme0/reset || return 1
	wait $pid || return 1
	# tuttid logs the revocation before it tells the holder, and reopens its files after: wait for the log.
	wait_for 10 grep -q "controller reset" $TD/log || { echo "tuttid did not log the reset"; return 1; }
	grep "controller reset" $TD/log
	wait_for 10 grep -q "nvme0: up again" $TD/log || { echo "tuttid did not reopen the controller within 10 s"; return 1; }
	$TC seal $TSOCK nvme0	# leases work after the reset
}
t tuttid-reset tuttid_reset
tuttid_restart_adopt() {
	# A holder alive across a SIGKILL of tuttid and its restart (restart policy: revoke all): the new tuttid
	# revokes the holder's file at bring-up, the holder's next READ gets no completion (and no SIGBUS), and
	# every leasable queue is granted while the holder still has its revoked file open.
	rm -f /tmp/td-leased /tmp/td-revoked /tmp/td-done
	$TC across $TSOCK nvme0 "$LBA" $TSCRATCH /tmp/td-leased /tmp/td-revoked /tmp/td-done &
	holder=$!
	wait_for 30 [ -e /tmp/td-leased ] || { kill -9 $holder; echo "no lease"; return 1; }
	kill -9 $TPID
	wait $TPID
	: >$TD/log
	tuttid_start || { kill -9 $holder; return 1; }
	ok=0
	grep -q "adopted PCI $ADDR" $TD/log || { echo "not adopted"; ok=1; }
	grep -q "nvme0 namespace 1: /dev/snvme0n1 on /mnt/tuttid (ext4, verified)" $TD/log || { echo "mount not verified"; ok=1; }
	grep -q "revoked [0-9]* open file(s) of /dev/snvme0 that this tuttid does not hold, with 2 queue group(s) of 2 queue pair(s)" $TD/log ||
		{ echo "the holder's 2 queue groups were not revoked at bring-up"; ok=1; }
	wait_for 30 [ -e /tmp/td-revoked ] || { echo "the holder saw no revocation within 30 s"; ok=1; }
	$TC full $TSOCK nvme0 4 || ok=1
	touch /tmp/td-done
	wait $holder || { echo "the holder across the restart failed"; ok=1; }
	$TC seal $TSOCK nvme0 || ok=1
	return $ok
}
t tuttid-restart-adopt tuttid_restart_adopt
tuttid_submit_after_revoke() {
	# A holder that keeps submitting, never reading CSTS first, on a LeasedController's DataPath and on a
	# queue it drives by hand, while tuttictl drain revokes its leases: it must report the errors and exit 0.
	rm -f /tmp/td-submitting
	$TC submit $TSOCK nvme0 "$LBA" $TSCRATCH /tmp/td-submitting &
	holder=$!
	wait_for 60 [ -e /tmp/td-submitting ] || { kill -9 $holder; echo "the holder never moved data"; return 1; }
	/bin/tuttictl --socket $TSOCK drain --deadline-ms 200 || { kill -9 $holder; return 1; }
	wait $holder || { echo "the holder did not exit cleanly"; return 1; }
	grep -q "revoked: pid $holder on nvme0" $TD/log || { echo "the holder's leases were not revoked"; return 1; }
}
t tuttid-submit-after-revoke tuttid_submit_after_revoke
tuttid_verified_stop() {
	# The mount this tuttid found at its restart (verified, not its own): SIGTERM leaves it mounted and the
	# controller bound, and says why; once the admin unmounted it, a new tuttid adopts and mounts it itself.
	kill -TERM $TPID
	wait_for 30 tuttid_gone || { echo "tuttid still runs 30 s after SIGTERM"; return 1; }
	wait $TPID
	rc=$?
	tail -n 3 $TD/log
	[ $rc = 0 ] || { echo "tuttid exited $rc"; return 1; }
	grep -q "^/dev/snvme0n1 /mnt/tuttid ext4" /proc/mounts || { echo "the verified /mnt/tuttid was unmounted"; return 1; }
	[ -e /dev/snvme0 ] || { echo "$ADDR was unbound under a mounted file system"; return 1; }
	grep -q "left $ADDR bound: /dev/snvme0n1 is mounted at /mnt/tuttid" $TD/log || { echo "the log does not say why"; return 1; }
	umount /mnt/tuttid || return 1
	: >$TD/log
	tuttid_start || return 1
	grep -q "adopted PCI $ADDR" $TD/log || return 1
	grep -q "nvme0 namespace 1: /dev/snvme0n1 on /mnt/tuttid (ext4, mounted)" $TD/log
}
t tuttid-verified-stop tuttid_verified_stop
tuttid_sigterm() {
	# A holder with the DataPath on its queues: revoked at the 2 s deadline, it sees its queues' CSTS read all
	# ones and tears down cleanly (no SIGBUS on the rings the driver revoked).
	rm -f /tmp/td-leased
	$TC revoked $TSOCK nvme0 "$LBA" $TSCRATCH /tmp/td-leased &
	holder=$!
	wait_for 30 [ -e /tmp/td-leased ] || { kill -9 $holder; echo "no lease"; return 1; }
	kill -TERM $TPID
	wait_for 30 tuttid_gone || { echo "tuttid still runs 30 s after SIGTERM"; return 1; }
	wait $holder || { echo "the revoked holder failed"; return 1; }
	wait $TPID
	rc=$?
	tail -n 8 $TD/log
	grep -q "revoked: pid $holder on nvme0" $TD/log || { echo "the holder's lease was not revoked"; return 1; }
	[ $rc = 0 ] || { echo "tuttid exited $rc"; return 1; }
	! grep -q " /mnt/tuttid " /proc/mounts || { echo "/mnt/tuttid still mounted"; return 1; }
	[ ! -e /sys/bus/pci/devices/$ADDR/driver ] && [ ! -e /dev/snvme0 ] || { echo "$ADDR still bound"; return 1; }
}
t tuttid-sigterm tuttid_sigterm
tuttid_two_at_once() {
	# Two tuttids started at once on the unbound controller, each with its own socket and state file (docs/daemon.md,
	# "PCI controllers", step 3). Whichever BINDs first and whichever adopts, exactly one takes the flock and comes up;
	# the other's bring-up fails BUSY naming the node, and its stop leaves the controller bound under the first one's
	# leases ("never held the flock"), even when it is the one whose BIND bound it; the holder's stop then unbinds.
	for n in 1 2; do
		sed -e "s|$TSOCK|$TD/two$n.sock|" -e "s|$TD/tuttid.state|$TD/two$n.state|" $TD/tuttid.json >$TD/two$n.json
		rm -f $TD/two$n.state
		: >$TD/two$n.log
	done
	/bin/tuttid --config $TD/two1.json >>$TD/two1.log 2>&1 &
	p1=$!
	/bin/tuttid --config $TD/two2.json >>$TD/two2.log 2>&1 &
	p2=$!
	state() { /bin/tuttictl --socket $TD/two$1.sock --json devices 2>/dev/null | sed -n 's/.*"state": *"\([a-z]*\)".*/\1/p'; }
	settled() { s1=$(state 1) && s2=$(state 2) && [ -n "$s1" ] && [ -n "$s2" ] && [ "$s1" != down ] && [ "$s2" != down ]; }
	wait_for 30 settled || { echo "the two tuttids did not settle within 30 s: '$(state 1)' '$(state 2)'"; cat $TD/two1.log $TD/two2.log; kill -9 $p1 $p2; return 1; }
	if [ "$s1" = up ] && [ "$s2" = failed ]; then w=1 l=2 wp=$p1 lp=$p2
	elif [ "$s1" = failed ] && [ "$s2" = up ]; then w=2 l=1 wp=$p2 lp=$p1
	else echo "want one up and one failed, got '$s1' and '$s2'"; cat $TD/two1.log $TD/two2.log; kill -9 $p1 $p2; return 1; fi
	ok=0
	grep -q "bound PCI $ADDR to snvme" $TD/two$l.log && echo "the one whose BIND bound the controller lost the flock"
	grep -q "bound PCI $ADDR to snvme" $TD/two$w.log && echo "the one whose BIND bound the controller won the flock"
	grep -q "/dev/snvme0' is locked (flock) by another process" $TD/two$l.log || { echo "the loser does not name the lock"; ok=1; }
	$TC seal $TD/two$w.sock nvme0 || { echo "the winner leases nothing"; ok=1; }
	kill -TERM $lp
	wait $lp || { echo "the loser exited $?"; ok=1; }
	grep -q "left $ADDR bound: this tuttid never held the flock of /dev/snvme0" $TD/two$l.log || { echo "the loser's stop does not say why it left the controller bound"; ok=1; }
	[ -e /dev/snvme0 ] && [ "$(state $w)" = up ] || { echo "the loser's stop took the controller from the winner"; ok=1; }
	$TC seal $TD/two$w.sock nvme0 || { echo "the winner leases nothing after the loser's stop"; ok=1; }
	kill -TERM $wp
	wait $wp || { echo "the winner exited $?"; ok=1; }
	! grep -q " /mnt/tuttid " /proc/mounts || { echo "/mnt/tuttid still mounted"; ok=1; }
	[ ! -e /sys/bus/pci/devices/$ADDR/driver ] && [ ! -e /dev/snvme0 ] || { echo "$ADDR still bound after the winner's stop"; ok=1; }
	tail -n 2 $TD/two$l.log $TD/two$w.log
	return $ok
}
t tuttid-two-at-once tuttid_two_at_once
t bind-after-tuttid $T bind "$ADDR"

# The timeout ladder (docs/driver.md): a mounted file system, 1 s deadlines,
# the fault injection knobs of the test build. The injections hit the next
# completions or interrupts, whoever's they are, so nothing else may do I/O:
# noatime (reads dirty nothing), noinit_itable (no lazy inode table zeroing).
ladder_setup() {
	mount -t ext4 -o noatime,noinit_itable /dev/snvme0n1 /mnt || return 1
	echo 1000 >/sys/block/snvme0n1/queue/io_timeout || return 1
	[ "$(cat /sys/block/snvme0n1/queue/io_timeout)" = 1000 ]
}
t ladder-setup ladder_setup
t timeout-poll $T timeout-poll /mnt/ladder /mnt
t timeout-abort-reset $T timeout-abort-reset /mnt/ladder /mnt
t timeout-fail $T timeout-fail /mnt/ladder /mnt
t reset-revoke $T reset-revoke
t libnvm-reset /bin/libnvm-snvme-test reset
t local-nvme-reset /bin/local-nvme-snvme-test reset "$LBA" $((248 * 1048576 / LBA))
t leaks-after-reset $T leaks
ladder_fsck() {
	grep -q ' /mnt ext4 rw' /proc/mounts || { echo "/mnt is not mounted read-write"; return 1; }
	md5sum /mnt/small /mnt/three-mib | cmp - /tmp/sums2 || return 1
	umount /mnt || return 1
	e2fsck -fn /dev/snvme0n1
}
t ladder-fsck ladder_fsck

# Hot removal, last: the rig's host side answers TUTTI-HOTPLUG-REQUEST with
# QMP device_del of the NVMe behind its pcie-root-port. Block readers, a file
# writer and a userspace queue group are busy meanwhile; each must end with
# an error, none may hang, and then rmmod must succeed.
pci_gone() { [ ! -e /sys/bus/pci/devices/$ADDR ]; }
hot_removal() {
	mount -t ext4 -o noatime /dev/snvme0n1 /mnt || return 1
	rm -f /tmp/r-*
	$T io-until-error /dev/snvme0n1 /tmp/r-raw & raw=$!
	$T io-until-error /mnt/busy /tmp/r-file & file=$!
	$T removal-holder /tmp/r-queues & holder=$!
	wait_for 120 all_ready || { echo "the I/O never got busy"; kill -9 $raw $file $holder; return 1; }
	echo "TUTTI-HOTPLUG-REQUEST nvme0 $ADDR"
	wait_for 120 pci_gone || { echo "$ADDR still present 120 s after the request"; return 1; }
	echo "$ADDR removed"
	ok=0
	wait $raw || { echo "raw block reader: no error"; ok=1; }
	wait $file || { echo "file writer: no error"; ok=1; }
	wait $holder || { echo "queue group holder failed"; ok=1; }
	umount /mnt || { echo "umount failed"; ok=1; }
	[ ! -e /dev/snvme0 ] && [ ! -e /dev/snvme0n1 ] || { echo "nodes left behind"; ok=1; }
	rmmod snvme || { echo "rmmod failed"; ok=1; }
	grep -q '^snvme ' /proc/modules && { echo "snvme still loaded"; ok=1; }
	return $ok
}
t hot-removal hot_removal
finish
