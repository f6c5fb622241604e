// The namespace of a KV store: everything that decides whether the bytes of a block written by one
// engine configuration may be served to another. A store records its namespace when it is created
// and refuses to open under any other, naming every field that differs (docs/kv-store.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <tutti/core/status.hpp>

namespace tutti::kv {

/// Limits of a namespace's fields.
inline constexpr std::size_t kMaxPieces = 16;                ///< memory pieces per block per layer
inline constexpr std::uint32_t kMaxLayers = 4096;            ///< layers (one data file each)
inline constexpr std::uint64_t kMaxPieceBytes = 1ull << 30;  ///< bytes of one piece (the runtime's request limit)
inline constexpr std::size_t kMaxNameBytes = 1024;           ///< bytes of each text field

/// What a block's bytes depend on. Every field takes part in the comparison at open.
struct Namespace {
  std::string model;                  ///< model identity, e.g. "meta-llama/Llama-3.1-8B@<revision>"
  std::string dtype;                  ///< KV dtype, e.g. "bfloat16"
  std::string tensor_layout = "NHD";  ///< "NHD" or "HND" (token, head, dim order of a piece)
  bool kv_split = true;               ///< K and V are separate pieces (vLLM's FlashAttention layout)
  bool cross_layer = false;           ///< one piece spans several layers (a cross-layer layout)
  std::uint32_t tp_rank = 0;          ///< tensor-parallel rank ...
  std::uint32_t tp_size = 1;          ///< ... of this many
  std::uint32_t pp_stage = 0;         ///< pipeline-parallel stage ...
  std::uint32_t pp_size = 1;          ///< ... of this many
  std::uint32_t block_tokens = 0;     ///< tokens per block (a shorter last block is allowed)
  std::uint32_t layers = 0;           ///< layers stored (one data file each)
  /// Bytes of each memory piece of one full block of one layer, e.g. {K bytes, V bytes}. The
  /// per-layer block bytes are their sum.
  std::vector<std::uint64_t> piece_bytes;
  std::string hash_algorithm;  ///< the engine's block-hash function, e.g. "sha256_cbor"
  std::string hash_seed;       ///< its seed (vLLM: PYTHONHASHSEED or the NONE_HASH value), as text

  /// Bytes of one full block of one layer (sum of piece_bytes).
  std::uint64_t layer_block_bytes() const noexcept {
    std::uint64_t sum = 0;
    for (auto b : piece_bytes) sum += b;
    return sum;
  }

  /// Checks every field against its limit; the message names the field, its value and the limit.
  Status validate() const {
    auto text = [](const char* field, const std::string& v, bool required) -> Status {
      if (required && v.empty())
        return error(StatusCode::INVALID_ARGUMENT, "namespace.{} is empty; it is required", field);
      if (v.size() > kMaxNameBytes)
        return error(StatusCode::INVALID_ARGUMENT, "namespace.{} has {} bytes; the limit is {}", field, v.size(),
                     kMaxNameBytes);
      return Status::success();
    };
    TUTTI_RETURN_IF_ERROR(text("model", model, true));
    TUTTI_RETURN_IF_ERROR(text("dtype", dtype, true));
    TUTTI_RETURN_IF_ERROR(text("hash_algorithm", hash_algorithm, true));
    TUTTI_RETURN_IF_ERROR(text("hash_seed", hash_seed, false));
    if (tensor_layout != "NHD" && tensor_layout != "HND")
      return error(StatusCode::INVALID_ARGUMENT, "namespace.tensor_layout = '{}' is not 'NHD' or 'HND'", tensor_layout);
    if (tp_size == 0 || tp_rank >= tp_size)
      return error(StatusCode::INVALID_ARGUMENT, "namespace.tp_rank = {} must be below namespace.tp_size = {}", tp_rank,
                   tp_size);
    if (pp_size == 0 || pp_stage >= pp_size)
      return error(StatusCode::INVALID_ARGUMENT, "namespace.pp_stage = {} must be below namespace.pp_size = {}",
                   pp_stage, pp_size);
    if (block_tokens == 0) return error(StatusCode::INVALID_ARGUMENT, "namespace.block_tokens = 0 must be >= 1");
    if (layers == 0 || layers > kMaxLayers)
      return error(StatusCode::INVALID_ARGUMENT, "namespace.layers = {} is outside 1..{}", layers, kMaxLayers);
    if (piece_bytes.empty() || piece_bytes.size() > kMaxPieces)
      return error(StatusCode::INVALID_ARGUMENT, "namespace.piece_bytes has {} entries; 1..{} are allowed",
                   piece_bytes.size(), kMaxPieces);
    for (std::size_t j = 0; j < piece_bytes.size(); ++j)
      if (piece_bytes[j] == 0 || piece_bytes[j] > kMaxPieceBytes)
        return error(StatusCode::INVALID_ARGUMENT, "namespace.piece_bytes[{}] = {} is outside 1..{}", j, piece_bytes[j],
                     kMaxPieceBytes);
    return Status::success();
  }

  nlohmann::json to_json() const {
    return nlohmann::json{{"model", model},
                          {"dtype", dtype},
                          {"tensor_layout", tensor_layout},
                          {"kv_split", kv_split},
                          {"cross_layer", cross_layer},
                          {"tp_rank", tp_rank},
                          {"tp_size", tp_size},
                          {"pp_stage", pp_stage},
                          {"pp_size", pp_size},
                          {"block_tokens", block_tokens},
                          {"layers", layers},
                          {"piece_bytes", piece_bytes},
                          {"hash_algorithm", hash_algorithm},
                          {"hash_seed", hash_seed}};
  }

  /// The namespace recorded in `j`. Errors: DATA_LOSS when a field is missing or of another type.
  static Result<Namespace> from_json(const nlohmann::json& j) {
    try {
      Namespace n;
      j.at("model").get_to(n.model);
      j.at("dtype").get_to(n.dtype);
      j.at("tensor_layout").get_to(n.tensor_layout);
      j.at("kv_split").get_to(n.kv_split);
      j.at("cross_layer").get_to(n.cross_layer);
      j.at("tp_rank").get_to(n.tp_rank);
      j.at("tp_size").get_to(n.tp_size);
      j.at("pp_stage").get_to(n.pp_stage);
      j.at("pp_size").get_to(n.pp_size);
      j.at("block_tokens").get_to(n.block_tokens);
      j.at("layers").get_to(n.layers);
      j.at("piece_bytes").get_to(n.piece_bytes);
      j.at("hash_algorithm").get_to(n.hash_algorithm);
      j.at("hash_seed").get_to(n.hash_seed);
      return Result<Namespace>(std::move(n));
    } catch (const nlohmann::json::exception& e) {
      return error(StatusCode::DATA_LOSS, "the stored namespace is unreadable: {}", e.what());
    }
  }

  /// "" when equal, else "field: stored X, requested Y; ..." for every field that differs.
  static std::string differences(const Namespace& stored, const Namespace& requested) {
    const nlohmann::json a = stored.to_json(), b = requested.to_json();
    std::string out;
    for (auto it = a.begin(); it != a.end(); ++it) {
      const auto& other = b.at(it.key());
      if (*it == other) continue;
      out += fmt::format("{}{}: stored {}, requested {}", out.empty() ? "" : "; ", it.key(), it->dump(), other.dump());
    }
    return out;
  }
};

}  // namespace tutti::kv
