// The memfs resolver: `memfs://NAME?size=BYTES` names a file held in host memory.
//
//  - NAME: 1 to 255 characters of [A-Za-z0-9._-] (after percent-decoding).
//  - size: decimal bytes, 1 <= size <= Options::max_file_bytes. Required when the file does not exist
//    yet (it is created, zero-filled); when it exists, an explicit size must equal its size.
//  - No other query keys are accepted.
// Errors: INVALID_ARGUMENT naming the field, value and limit (bad scheme, empty name, bad
// characters, size not a number, size 0 or over the limit, size differing from the existing file,
// unknown query key); NOT_FOUND when the file does not exist and no size was given;
// RESOURCE_EXHAUSTED when creating it would exceed Options::max_total_bytes.
//
// Thread-safety: resolve() may be called from several threads at once (open_batch does).
#pragma once

#include <cstdint>
#include <optional>
#include <map>
#include <new>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include <tutti/bind/memfs.hpp>
#include <tutti/core/decimal.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/status.hpp>
#include <tutti/core/uri.hpp>

namespace tutti::memfs {

/// The files of one memfs instance, shared by the resolver and every payload it hands out.
class Store {
 public:
  struct Options {
    static constexpr std::uint64_t kDefaultMaxFileBytes = std::uint64_t{1} << 32;   // 4 GiB
    static constexpr std::uint64_t kDefaultMaxTotalBytes = std::uint64_t{1} << 34;  // 16 GiB
    std::uint64_t max_file_bytes = kDefaultMaxFileBytes;                            ///< Largest size= accepted.
    std::uint64_t max_total_bytes = kDefaultMaxTotalBytes;                          ///< Sum of all file sizes.
  };
  Store() = default;
  explicit Store(Options options) : options_(options) {}

  const Options& options() const noexcept { return options_; }

  /// Finds `name`, or creates it with `size` bytes when size is given. See the file comment for errors.
  Result<std::shared_ptr<File>> find_or_create(const std::string& name, std::optional<std::uint64_t> size) {
    std::scoped_lock lock(mutex_);
    if (auto it = files_.find(name); it != files_.end()) {
      if (size && *size != it->second->size)
        return error(StatusCode::INVALID_ARGUMENT, "memfs file '{}' exists with size {}; size = {} differs", name,
                     it->second->size, *size);
      return it->second;
    }
    if (!size)
      return error(StatusCode::NOT_FOUND, "memfs file '{}' does not exist; add ?size=BYTES to create it", name);
    if (*size > options_.max_total_bytes - total_bytes_)
      return error(StatusCode::RESOURCE_EXHAUSTED,
                   "memfs file '{}' of {} bytes would exceed the store limit of {} bytes ({} in use)", name, *size,
                   options_.max_total_bytes, total_bytes_);
    auto file = std::make_shared<File>();
    file->name = name;
    file->size = *size;
    file->bytes.reset(new (std::nothrow) std::byte[*size]());  // value-initialised: zeroed
    if (!file->bytes)
      return error(StatusCode::RESOURCE_EXHAUSTED, "memfs file '{}': cannot allocate {} bytes", name, *size);
    total_bytes_ += *size;
    files_.emplace(name, file);
    return file;
  }

 private:
  Options options_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<File>, std::less<>> files_;
  std::uint64_t total_bytes_ = 0;
};

/// Resolver for memfs:// URIs. Copies share one Store.
class MemfsResolver {
 public:
  using target_type = Target;
  static constexpr std::string_view scheme = "memfs";
  static constexpr std::size_t kMaxNameLength = 255;

  MemfsResolver() : store_(std::make_shared<Store>()) {}
  explicit MemfsResolver(std::shared_ptr<Store> store) : store_(std::move(store)) {}

  Result<Target> resolve(std::string_view text, const OpenOptions&) {
    auto uri = parse_uri(text);
    if (!uri) return uri.status();
    if (uri->scheme != scheme)
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}' has scheme '{}'; the memfs resolver serves 'memfs'", text,
                   uri->scheme);
    if (uri->has_user_info || uri->has_port || uri->has_fragment)
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}': memfs URIs take no user info, port or fragment", text);
    if (!uri->path.empty() && uri->path != "/")
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}': memfs names have no path ('{}'); use memfs://NAME", text,
                   uri->path);
    const std::string& name = uri->authority;
    if (name.empty() || name.size() > kMaxNameLength)
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}': name length {} is outside 1..{}", text, name.size(),
                   kMaxNameLength);
    for (char c : name)
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
            c == '-'))
        return error(StatusCode::INVALID_ARGUMENT, "uri '{}': name '{}' may only hold [A-Za-z0-9._-]", text, name);

    std::optional<std::uint64_t> size;
    for (const auto& [key, value] : uri->query) {
      if (key == "size" && size)
        return error(StatusCode::INVALID_ARGUMENT, "uri '{}': size is given more than once", text);
      if (key != "size")
        return error(StatusCode::INVALID_ARGUMENT, "uri '{}': unknown query key '{}' (memfs takes only size)", text,
                     key);
      const std::optional<std::uint64_t> number = parse_decimal(value);
      if (!number)
        return error(StatusCode::INVALID_ARGUMENT, "uri '{}': size = '{}' is not a decimal number of bytes", text,
                     value);
      const std::uint64_t parsed = *number;
      if (parsed == 0 || parsed > store_->options().max_file_bytes)
        return error(StatusCode::INVALID_ARGUMENT, "uri '{}': size = {} is outside 1..{} bytes", text, parsed,
                     store_->options().max_file_bytes);
      size = parsed;
    }
    auto file = store_->find_or_create(name, size);
    if (!file) return file.status();
    return Target{std::move(file.value())};
  }

  /// The store this resolver creates files in.
  const std::shared_ptr<Store>& store() const noexcept { return store_; }

 private:
  std::shared_ptr<Store> store_;
};

}  // namespace tutti::memfs
