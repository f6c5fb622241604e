// The striped_file resolver: `striped://NAME?devs=P0,P1,...&unit=BYTES` -> one logical target
// striped round robin over N shard files (tutti::striped_file::Target, bind/striped_file.hpp).
//
// Grammar (docs/striping.md):
//   NAME   the target's name, for messages (the URI's host part; required)
//   devs   the shard files, one per controller in the resolver's order, comma-separated; each an
//          absolute path, percent-encoded (a ',' inside a path is written %2C); required
//   unit   the stripe unit in bytes, decimal, > 0 (one K/V tensor); required
// No other key, no path after NAME, no user info, port or fragment.
//
// resolve(uri, options):
//  1. parse, INVALID_ARGUMENT naming the field for anything outside the grammar, for a devs list
//     whose length is not the number of controllers configured (Options::shards), and for a unit
//     that is 0 or not a number;
//  2. shard i is resolved by local_file (FIEMAP) with Options::shards[i] (its block device, LBA
//     size and NSID): every local_file error, with context "striped 'NAME': devs[i] = 'PATH'"
//     (NOT_FOUND for a missing shard);
//  3. INVALID_ARGUMENT when the unit is not a multiple of a shard's LBA size (shards may use
//     different LBA formats), or a shard cannot hold one unit; each naming the shard, its path,
//     the value and the limit;
//  4. the logical size is N x the shortest shard rounded down to whole units.
// Thread-safety: resolve() is const and may be called from many threads at once.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tutti/bind/striped_file.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/status.hpp>
#include <tutti/core/uri.hpp>
#include <tutti/resolve/local_file.hpp>

namespace tutti::striped_file {

class StripedFileResolver {
 public:
  using target_type = Target;
  static constexpr std::string_view scheme = "striped";

  /// Settings: one local_file resolver configuration per controller, in controller order
  /// (shard i of every striped:// URI is resolved with shards[i]).
  struct Options {
    std::vector<local_file::LocalFileResolver::Options> shards;
  };

  /// Creates the per-shard resolvers. Errors: INVALID_ARGUMENT (no shard, more than kMaxShards),
  /// and each LocalFileResolver::create error with context "striped: shards[i]".
  static Result<StripedFileResolver> create(Options options) {
    if (options.shards.empty() || options.shards.size() > kMaxShards)
      return error(StatusCode::INVALID_ARGUMENT, "striped: shards = {}; expected 1 to {} controllers",
                   options.shards.size(), kMaxShards);
    StripedFileResolver r;
    for (std::size_t i = 0; i < options.shards.size(); ++i) {
      auto made = local_file::LocalFileResolver::create(options.shards[i]);
      if (!made) return made.status().with_context(fmt::format("striped: shards[{}]", i));
      r.shards_.push_back(std::move(made.value()));
    }
    return r;
  }

  /// The number of controllers (shards per target).
  std::size_t shard_count() const noexcept { return shards_.size(); }
  const local_file::LocalFileResolver& shard(std::size_t i) const { return shards_.at(i); }

  /// Resolves `text`; see the file comment for every error.
  Result<Target> resolve(std::string_view text, const OpenOptions& open_options) const {
    auto uri = parse_uri(text);
    if (!uri) return uri.status();
    if (uri->scheme != scheme)
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}' has scheme '{}'; the striped resolver serves 'striped'",
                   text, uri->scheme);
    if (uri->authority.empty())
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}': NAME is empty; expected striped://NAME?devs=...&unit=BYTES",
                   text);
    if (uri->has_user_info || uri->has_port || uri->has_fragment || (!uri->path.empty() && uri->path != "/"))
      return error(StatusCode::INVALID_ARGUMENT,
                   "uri '{}': a striped URI is striped://NAME?devs=...&unit=BYTES (no user, port, path or fragment)",
                   text);
    Target t;
    t.name = uri->authority;
    for (const auto& [key, value] : uri->query)
      if (key != "devs" && key != "unit")
        return error(StatusCode::INVALID_ARGUMENT, "striped '{}': unknown query key '{}'; expected devs and unit",
                     t.name, key);
    // devs: split the raw (still percent-encoded) value at ',', then decode each path, so that an
    // encoded comma stays inside its path.
    const std::string_view raw = raw_query_value(text, "devs");
    if (raw.empty())
      return error(StatusCode::INVALID_ARGUMENT, "striped '{}': devs is missing or empty; expected {} shard paths",
                   t.name, shards_.size());
    std::vector<std::string> paths;
    for (std::size_t start = 0;;) {
      const std::size_t comma = raw.find(',', start);
      paths.push_back(tutti::detail::unescape(std::string(raw.substr(start, comma - start))));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (paths.size() != shards_.size())
      return error(StatusCode::INVALID_ARGUMENT,
                   "striped '{}': devs lists {} shard files but {} controllers are configured (one shard each)", t.name,
                   paths.size(), shards_.size());
    const auto unit_text = uri->query_value("unit");
    if (!unit_text || unit_text->empty())
      return error(StatusCode::INVALID_ARGUMENT, "striped '{}': unit is missing; expected the stripe unit in bytes",
                   t.name);
    const auto [end, ec] = std::from_chars(unit_text->data(), unit_text->data() + unit_text->size(), t.unit_bytes);
    if (ec != std::errc() || end != unit_text->data() + unit_text->size() || t.unit_bytes == 0)
      return error(StatusCode::INVALID_ARGUMENT, "striped '{}': unit = '{}' is not a byte count from 1 to {}", t.name,
                   *unit_text, UINT64_MAX);
    std::uint64_t shortest = UINT64_MAX;
    for (std::size_t i = 0; i < paths.size(); ++i) {
      const std::string context = fmt::format("striped '{}': devs[{}] = '{}'", t.name, i, paths[i]);
      if (paths[i].empty() || paths[i].front() != '/')
        return error(StatusCode::INVALID_ARGUMENT, "{}: expected an absolute path", context);
      auto shard = shards_[i].resolve_path(paths[i], open_options);
      if (!shard) return shard.status().with_context(context);
      if (t.unit_bytes % shard->lba_size != 0)
        return error(StatusCode::INVALID_ARGUMENT, "{}: unit = {} bytes is not a multiple of its {}-byte LBA size",
                     context, t.unit_bytes, shard->lba_size);
      if (shard->file_size < t.unit_bytes)
        return error(StatusCode::INVALID_ARGUMENT, "{}: the shard holds {} bytes, less than one unit of {} bytes",
                     context, shard->file_size, t.unit_bytes);
      shortest = std::min(shortest, shard->file_size);
      t.shards.push_back(std::move(shard.value()));
    }
    t.logical_size = (shortest / t.unit_bytes) * t.unit_bytes * t.shards.size();
    return Result<Target>(std::move(t));
  }

 private:
  StripedFileResolver() = default;

  /// The raw value of query key `key` in `text` (undecoded), or empty.
  static std::string_view raw_query_value(std::string_view text, std::string_view key) {
    const std::size_t q = text.find('?');
    if (q == std::string_view::npos) return {};
    std::string_view query = text.substr(q + 1);
    query = query.substr(0, query.find('#'));
    while (!query.empty()) {
      const std::size_t amp = query.find('&');
      const std::string_view item = query.substr(0, amp);
      if (item.size() > key.size() && item.substr(0, key.size()) == key && item[key.size()] == '=')
        return item.substr(key.size() + 1);
      if (amp == std::string_view::npos) break;
      query = query.substr(amp + 1);
    }
    return {};
  }

  std::vector<local_file::LocalFileResolver> shards_;
};

}  // namespace tutti::striped_file
