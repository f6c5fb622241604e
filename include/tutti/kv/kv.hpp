// The KV block store, front header. Include this (meson: tutti_kv_dep; pkg-config: tutti-kv).
//
//   kv/store.hpp        KvStore<Runtime>: open, lookup, load, store, wait, wait_layer, commit, discard,
//                       pin, unpin, evict, statistics; StoreOptions, Piece, KvIo, LayerResult, Statistics
//   kv/namespace.hpp    Namespace: what a block's bytes depend on; a store refuses any other
//   kv/layout.hpp       Layout: one preallocated file per layer, fixed-size slots; file creation
//   kv/index.hpp        Index: LMDB, key -> BlockRecord (slot, generation, lengths, checksums)
//   kv/slots.hpp        SlotTable: free list, pins, CLOCK eviction
//   kv/checksum.hpp     host_checksum (libxxhash), DeviceHasher (XXH3 kernels through accel::launch)
//   kv/xxh3.hpp         XXH3-64 as host/device functions, bit-exact with libxxhash
//   kv/writer_lock.hpp  WriterLock: one writer process per directory (flock, pid in the refusal)
//
// docs/kv-store.md: layout, index format, crash rules, limits, API with units, errors, threads.
#pragma once

#include <tutti/kv/checksum.hpp>
#include <tutti/kv/index.hpp>
#include <tutti/kv/layout.hpp>
#include <tutti/kv/namespace.hpp>
#include <tutti/kv/slots.hpp>
#include <tutti/kv/store.hpp>
#include <tutti/kv/writer_lock.hpp>
#include <tutti/kv/xxh3.hpp>
