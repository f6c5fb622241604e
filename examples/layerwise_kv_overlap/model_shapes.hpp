// The KV-cache shape of a model: layers, KV heads, head dimension and dtype, from the presets of
// data/model_shapes.json (public facts from each model's config.json, embedded at build time: see
// model_shapes_json.hpp.in) or given one by one. One K or one V tensor of one layer for B tokens is
// B x kv_heads x head_dim x dtype bytes.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <tutti/core/status.hpp>

#include "model_shapes_json.hpp"
#include "progress.hpp"

namespace layerwise {

/// A model's side of the KV shape.
struct ModelShape {
  std::string name;               ///< The preset's name ("llama-3-70b"), or "custom".
  std::uint32_t layers = 0;       ///< Transformer layers (num_hidden_layers).
  std::uint32_t kv_heads = 0;     ///< KV heads per layer (num_key_value_heads).
  std::uint32_t head_dim = 0;     ///< Elements per head.
  std::string dtype;              ///< A key of the data file's "dtypes" ("bf16").
  std::uint32_t dtype_bytes = 0;  ///< Bytes per element of `dtype`.

  /// Bytes of one K (or one V) tensor of one layer for `tokens` tokens; saturates at UINT64_MAX.
  std::uint64_t tensor_bytes(std::uint32_t tokens) const {
    const unsigned __int128 bytes = static_cast<unsigned __int128>(tokens) * kv_heads * head_dim * dtype_bytes;
    return bytes > UINT64_MAX ? UINT64_MAX : static_cast<std::uint64_t>(bytes);
  }
  /// "80 layers, 8 KV heads x head dim 128, bf16".
  std::string describe() const {
    return fmt::format("{}, {} x head dim {}, {}", counted(layers, "layer"), counted(kv_heads, "KV head"), head_dim,
                       dtype);
  }
};

/// The presets and dtypes of a model-shapes file. Immutable after parse; safe to share between threads.
class ModelShapes {
 public:
  /// Parses the JSON of data/model_shapes.json. Errors: INVALID_ARGUMENT naming the entry and the
  /// field that is missing, not a positive integer, or names an unknown dtype.
  static tutti::Result<ModelShapes> parse(std::string_view text) {
    auto json = nlohmann::json::parse(text, nullptr, false);
    if (json.is_discarded() || !json.is_object())
      return tutti::error(tutti::StatusCode::INVALID_ARGUMENT, "model shapes: not a JSON object");
    ModelShapes out;
    if (!json.contains("dtypes") || !json["dtypes"].is_object())
      return tutti::error(tutti::StatusCode::INVALID_ARGUMENT, "model shapes: no \"dtypes\" object");
    for (const auto& [name, dtype] : json["dtypes"].items()) {
      if (!dtype.contains("bytes") || !dtype["bytes"].is_number_unsigned() ||
          dtype["bytes"].get<std::uint64_t>() == 0 || dtype["bytes"].get<std::uint64_t>() > 16)
        return tutti::error(tutti::StatusCode::INVALID_ARGUMENT, "model shapes: dtype '{}' needs \"bytes\" in [1, 16]",
                            name);
      out.dtype_bytes_[name] = dtype["bytes"].get<std::uint32_t>();
    }
    if (!json.contains("models") || !json["models"].is_object())
      return tutti::error(tutti::StatusCode::INVALID_ARGUMENT, "model shapes: no \"models\" object");
    for (const auto& [name, model] : json["models"].items()) {
      ModelShape shape;
      shape.name = name;
      for (auto [field, target] : {std::pair{"layers", &shape.layers}, std::pair{"kv_heads", &shape.kv_heads},
                                   std::pair{"head_dim", &shape.head_dim}}) {
        if (!model.contains(field) || !model[field].is_number_unsigned() || model[field].get<std::uint64_t>() == 0 ||
            model[field].get<std::uint64_t>() > UINT32_MAX)
          return tutti::error(tutti::StatusCode::INVALID_ARGUMENT,
                              "model shapes: model '{}' needs \"{}\", a positive 32-bit integer", name, field);
        *target = model[field].get<std::uint32_t>();
      }
      if (!model.contains("dtype") || !model["dtype"].is_string() ||
          !out.dtype_bytes_.contains(model["dtype"].get<std::string>()))
        return tutti::error(tutti::StatusCode::INVALID_ARGUMENT,
                            "model shapes: model '{}' needs \"dtype\", one of the \"dtypes\"", name);
      shape.dtype = model["dtype"].get<std::string>();
      shape.dtype_bytes = out.dtype_bytes_.at(shape.dtype);
      out.models_[name] = shape;
    }
    if (out.models_.empty()) return tutti::error(tutti::StatusCode::INVALID_ARGUMENT, "model shapes: no models");
    return tutti::Result<ModelShapes>(std::move(out));
  }

  /// The shapes built into this program (data/model_shapes.json as it was at build time).
  static const ModelShapes& built_in() {
    static const ModelShapes shapes = [] {
      auto parsed = parse(kModelShapesJson);
      if (!parsed) {  // the build's own data file: a broken one is a build defect, caught by the tests
        fmt::print(stderr, "error: data/model_shapes.json as built in: {}\n", parsed.status().to_string());
        std::abort();
      }
      return std::move(parsed.value());
    }();
    return shapes;
  }

  /// The preset `name`, or nullptr.
  const ModelShape* find(const std::string& name) const {
    auto it = models_.find(name);
    return it == models_.end() ? nullptr : &it->second;
  }
  /// Bytes per element of dtype `name`; 0 when unknown.
  std::uint32_t dtype_bytes(const std::string& name) const {
    auto it = dtype_bytes_.find(name);
    return it == dtype_bytes_.end() ? 0 : it->second;
  }
  std::vector<std::string> model_names() const {
    std::vector<std::string> names;
    for (const auto& [name, shape] : models_) names.push_back(name);
    return names;
  }
  std::vector<std::string> dtype_names() const {
    std::vector<std::string> names;
    for (const auto& [name, bytes] : dtype_bytes_) names.push_back(name);
    return names;
  }

 private:
  std::map<std::string, ModelShape> models_;
  std::map<std::string, std::uint32_t> dtype_bytes_;
};

}  // namespace layerwise
