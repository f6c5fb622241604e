// URI parsing shared by every resolver (RFC 3986, through the uriparser library).
//
// parse_uri("file:///mnt/nvme0/kv/layer%2017?x=1") gives scheme "file", empty authority,
// path "/mnt/nvme0/kv/layer 17" (percent-decoded) and query {("x", "1")}.
//
// Errors (all INVALID_ARGUMENT, the message names the URI and the problem): empty URI; no scheme;
// no "//" authority marker; grammar errors such as bad percent-encoding ("%zz") with the offending
// character position; a decoded path segment containing NUL or '/'.
//
// escape_path is the other direction for paths: "/mnt/kv/layer 17" -> "/mnt/kv/layer%2017", so that
// "file://" + escape_path(p) parses back to absolute(p) with empty segments and a trailing '/' dropped.
//
// Thread-safety: pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <uriparser/Uri.h>

#include <tutti/core/status.hpp>

namespace tutti {

/// A parsed URI. Strings are percent-decoded.
struct Uri {
  std::string scheme;     ///< Lower-case scheme, e.g. "file".
  std::string authority;  ///< Host part; empty for "file:///path".
  std::string path;       ///< "/"-joined decoded segments; starts with "/" when the URI has one.
  std::vector<std::pair<std::string, std::string>> query;  ///< Decoded key/value pairs, in order.
  bool has_user_info = false;  ///< "user@" before the host; resolvers that take none must refuse it.
  bool has_port = false;       ///< ":port" after the host.
  bool has_fragment = false;   ///< "#fragment" at the end.

  /// The value of query key `key`, if present (the first one when repeated).
  std::optional<std::string_view> query_value(std::string_view key) const {
    for (const auto& [k, v] : query)
      if (k == key) return std::string_view(v);
    return std::nullopt;
  }
};

namespace detail {
inline std::string range_text(const UriTextRangeA& r) {
  if (r.first == nullptr || r.afterLast == nullptr) return {};
  return std::string(r.first, static_cast<std::size_t>(r.afterLast - r.first));
}
inline std::string unescape(std::string text) {
  if (text.empty()) return text;
  const char* end = uriUnescapeInPlaceExA(text.data(), URI_FALSE, URI_BR_DONT_TOUCH);
  text.resize(static_cast<std::size_t>(end - text.data()));
  return text;
}
}  // namespace detail

/// The path part of a URI for `path`: made absolute (std::filesystem::absolute, against the working
/// directory for a relative path), every segment percent-encoded by uriparser (uriEscapeA: all but
/// RFC 3986's unreserved characters, so ' ', '%', '#', '?', ',' and bytes from 0x80 are encoded, as
/// striped:// lists need) and joined with '/': "/a b/c,d" -> "/a%20b/c%2Cd". Empty segments ("//")
/// and a trailing '/' are dropped, "." and ".." kept as they are (no normalization), the root gives
/// "/"; a segment ends at its first NUL byte. parse_uri decodes the result back to that path.
/// An empty path, or a relative one that cannot be made absolute (the working directory removed),
/// gives "": the resolvers then refuse the URI ("file://" has an empty path) instead of opening
/// another file. Allocates the result.
inline std::string escape_path(const std::filesystem::path& path) {
  if (path.empty()) return {};
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  if (ec || !absolute.is_absolute()) return {};
  std::string out;
  for (const auto& part : absolute) {
    const std::string segment = part.string();
    if (segment.empty() || segment == "/") continue;
    std::string escaped(segment.size() * 3 + 1, '\0');
    const char* end = uriEscapeA(segment.c_str(), escaped.data(), URI_FALSE, URI_FALSE);
    escaped.resize(static_cast<std::size_t>(end - escaped.data()));
    out += "/" + escaped;
  }
  return out.empty() ? std::string("/") : out;  // the root has no segment
}

/// Parses and percent-decodes an absolute URI of the form scheme://authority/path?query.
inline Result<Uri> parse_uri(std::string_view text) {
  if (text.empty()) return error(StatusCode::INVALID_ARGUMENT, "uri is empty; expected scheme://path");
  const std::size_t marker = text.find("://");
  if (marker == std::string_view::npos || marker == 0)
    return error(StatusCode::INVALID_ARGUMENT, "uri '{}' has no scheme followed by '://'", text);

  const std::string owned(text);
  UriUriA parsed;
  const char* error_position = nullptr;
  if (uriParseSingleUriExA(&parsed, owned.data(), owned.data() + owned.size(), &error_position) != URI_SUCCESS) {
    const std::size_t at = error_position ? static_cast<std::size_t>(error_position - owned.data()) : 0;
    return error(StatusCode::INVALID_ARGUMENT,
                 "uri '{}' is malformed at character {} ('{}'): check percent-encoding (%XX with hex digits) "
                 "and reserved characters",
                 text, at, at < owned.size() ? owned.substr(at, 1) : std::string("end"));
  }
  std::unique_ptr<UriUriA, void (*)(UriUriA*)> guard(&parsed, [](UriUriA* u) { uriFreeUriMembersA(u); });

  Uri uri;
  uri.scheme = detail::range_text(parsed.scheme);
  for (char& c : uri.scheme) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  uri.authority = detail::unescape(detail::range_text(parsed.hostText));
  uri.has_user_info = parsed.userInfo.first != nullptr;
  uri.has_port = parsed.portText.first != nullptr;
  uri.has_fragment = parsed.fragment.first != nullptr;
  for (const UriPathSegmentA* seg = parsed.pathHead; seg != nullptr; seg = seg->next) {
    std::string decoded = detail::unescape(detail::range_text(seg->text));
    if (decoded.find('\0') != std::string::npos || decoded.find('/') != std::string::npos)
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}' has a path segment that decodes to a NUL or '/' character",
                   text);
    uri.path += '/';
    uri.path += decoded;
  }

  const std::string query = detail::range_text(parsed.query);
  if (!query.empty()) {
    UriQueryListA* list = nullptr;
    int count = 0;
    if (uriDissectQueryMallocExA(&list, &count, query.data(), query.data() + query.size(), URI_FALSE,
                                 URI_BR_DONT_TOUCH) != URI_SUCCESS)
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}' has a malformed query '{}'", text, query);
    for (const UriQueryListA* item = list; item != nullptr; item = item->next)
      uri.query.emplace_back(item->key ? item->key : "", item->value ? item->value : "");
    uriFreeQueryListA(list);
  }
  return uri;
}

}  // namespace tutti
