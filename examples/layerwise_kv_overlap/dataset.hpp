// The KV-cache data set of the layer-wise example: its shape, its on-file layout, the content of
// every tensor, and the per-tensor checksums every read is verified against.
//
// Layout: the KV block store's (tutti::kv::Layout, include/tutti/kv/layout.hpp, docs/kv-store.md), so the
// example's files are laid out as a store's data files are. A prefix of `context_tokens` tokens is cut
// into chunks (blocks) of `chunk_tokens`; each chunk holds a K and a V tensor of `tensor_bytes` bytes for
// every layer. One file per layer (kv::Layout::file_name: "layer-00000.kv"), one slot per chunk (slot c
// holds chunk c), the K and V tensors the slot's two pieces, each at a 4096-byte boundary: with
// `tensor_bytes` a multiple of 4096, chunk c's K tensor is at byte offset (2c) * tensor_bytes of its
// layer's file and its V tensor at (2c + 1) * tensor_bytes.
//
// Hits and misses: the first `hit_chunks` chunks of the prefix are in the SSD cache (restored by
// reads); the remaining chunks are recomputed and written back (writes of layer L-1).
//
// Striping (--backend nvme-soft-striped, stripe_devices > 1): each layer's logical file is the
// striped:// target of `stripe_devices` shard files, one per ext4 image, in units of one K or V tensor
// (tensor_bytes), round robin (tutti::striped_file::place, docs/striping.md): the tensor at logical
// offset x lies in shard (x / tensor_bytes) % N at (x / tensor_bytes / N) * tensor_bytes. Each shard file
// holds shard_file_bytes(): its units, the last ones zero-filled where the layer's unit count is not a
// multiple of N (so the logical size, N x the shortest shard, covers the whole layer).
#pragma once

#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <tutti/kv/layout.hpp>

namespace layerwise {

/// Shape of the data set. All sizes in bytes.
struct Shape {
  std::uint32_t layers = 80;
  std::uint32_t context_tokens = 4096;
  std::uint32_t chunk_tokens = 256;
  std::uint32_t hit_percent = 75;           ///< Share of the prefix's chunks found in the cache.
  std::uint64_t tensor_bytes = 512 * 1024;  ///< One K or V tensor of one chunk of one layer.
  /// Shard files per layer (1: one plain layer file; N > 1: striped over N devices, a unit per tensor).
  std::uint32_t stripe_devices = 1;

  std::uint32_t chunks() const { return (context_tokens + chunk_tokens - 1) / chunk_tokens; }
  std::uint32_t hit_chunks() const { return static_cast<std::uint32_t>(std::uint64_t{chunks()} * hit_percent / 100); }
  std::uint32_t miss_chunks() const { return chunks() - hit_chunks(); }
  /// The KV store's layout of this data set: `layers` files, a slot per chunk, pieces {K, V} of
  /// `tensor_bytes` each. The store sizes its slot count from a byte bound; here it is the chunk count.
  tutti::kv::Layout layout() const {
    tutti::kv::Namespace ns;
    ns.layers = std::max(1u, layers);  // (a shape of 0 layers is refused before use; no division by 0 here)
    ns.piece_bytes = {tensor_bytes, tensor_bytes};
    tutti::kv::Layout l = tutti::kv::Layout::compute(ns, UINT64_MAX).value();  // the bound is never below a block
    l.layers = layers;
    l.slots = chunks();
    return l;
  }
  std::uint64_t layer_file_bytes() const { return layout().file_bytes(); }
  /// Byte offset of chunk `chunk`'s K (kind 0) or V (kind 1) tensor in its layer file.
  std::uint64_t tensor_offset(std::uint32_t chunk, std::uint32_t kind) const { return layout().offset(chunk, kind); }
  std::string layer_file_name(std::uint32_t layer) const { return tutti::kv::Layout::file_name(layer); }
  /// Bytes of one shard file of a layer: layer_file_bytes() with stripe_devices 1; else the layer's
  /// tensor_bytes units (rounded up) divided over the shards, rounded up to whole units.
  std::uint64_t shard_file_bytes() const {
    if (stripe_devices <= 1 || tensor_bytes == 0) return layer_file_bytes();
    const std::uint64_t units = (layer_file_bytes() + tensor_bytes - 1) / tensor_bytes;
    return (units + stripe_devices - 1) / stripe_devices * tensor_bytes;
  }
};

/// The splitmix64 seed of one tensor, from its coordinates and salt (see fill_tensor).
/// Word i (0-based) of a tensor is splitmix64's output for state seed + (i + 1) * 0x9e3779b97f4a7c15; the
/// CUDA build's fill kernel (gpu_compute.cu) produces the same bytes on the GPU from the same seed.
inline std::uint64_t tensor_seed(std::uint32_t layer, std::uint32_t chunk, std::uint32_t kind, std::uint64_t salt = 0) {
  return (std::uint64_t{layer} << 40) ^ (std::uint64_t{chunk} << 8) ^ kind ^ 0x7475747469ULL ^
         (salt * 0xd1b54a32d192ed03ULL);
}

/// Fills `out` with the deterministic content of one tensor (a splitmix64 stream seeded by its
/// coordinates), so any process can regenerate what a tensor must hold.
/// `salt` 0 is the prepared (cached) content; the pipeline writes recomputed tensors with a per-run salt.
inline void fill_tensor(std::span<std::byte> out, std::uint32_t layer, std::uint32_t chunk, std::uint32_t kind,
                        std::uint64_t salt = 0) {
  std::uint64_t state = tensor_seed(layer, chunk, kind, salt);
  const std::size_t words = out.size() / sizeof(std::uint64_t);
  auto* w = reinterpret_cast<std::uint64_t*>(out.data());
  for (std::size_t i = 0; i < words; ++i) {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    w[i] = z ^ (z >> 31);
  }
  for (std::size_t i = words * sizeof(std::uint64_t); i < out.size(); ++i) out[i] = static_cast<std::byte>(i);
}

/// The checksum of one tensor's bytes (XXH3, 64 bits).
inline std::uint64_t checksum(std::span<const std::byte> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

/// Expected checksums, indexed [layer][chunk * 2 + kind].
struct Checksums {
  std::vector<std::vector<std::uint64_t>> by_layer;
  std::uint64_t at(std::uint32_t layer, std::uint32_t chunk, std::uint32_t kind) const {
    return by_layer[layer][chunk * 2 + kind];
  }
};

/// Computes the checksum of every tensor of the data set.
inline Checksums expected_checksums(const Shape& shape) {
  Checksums sums;
  std::vector<std::byte> tensor(shape.tensor_bytes);
  sums.by_layer.resize(shape.layers);
  for (std::uint32_t l = 0; l < shape.layers; ++l)
    for (std::uint32_t c = 0; c < shape.chunks(); ++c)
      for (std::uint32_t k = 0; k < 2; ++k) {
        fill_tensor(tensor, l, c, k);
        sums.by_layer[l].push_back(checksum(tensor));
      }
  return sums;
}

}  // namespace layerwise
