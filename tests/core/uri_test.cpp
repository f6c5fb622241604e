#include <doctest/doctest.h>

#include <tutti/core/uri.hpp>

using tutti::escape_path;
using tutti::parse_uri;
using tutti::StatusCode;

TEST_CASE("a file URI is split and percent-decoded") {
  auto uri = parse_uri("file:///mnt/nvme0/kv/layer%2017");
  REQUIRE(uri.is_ok());
  CHECK(uri->scheme == "file");
  CHECK(uri->authority.empty());
  CHECK(uri->path == "/mnt/nvme0/kv/layer 17");
}

TEST_CASE("the scheme is case-insensitive and the query is decoded in order") {
  auto uri = parse_uri("MEMFS://cache?size=4096&x=a%20b");
  REQUIRE(uri.is_ok());
  CHECK(uri->scheme == "memfs");
  CHECK(uri->authority == "cache");
  CHECK(uri->query_value("size") == "4096");
  CHECK(uri->query_value("x") == "a b");
  CHECK_FALSE(uri->query_value("y").has_value());
}

TEST_CASE("malformed URIs are INVALID_ARGUMENT with a message naming the problem") {
  struct Case {
    const char* uri;
    const char* words;
  };
  for (const Case& c : {Case{"", "empty"}, Case{"no-scheme-here", "'://'"}, Case{"://x", "'://'"},
                        Case{"file:///a%zzb", "percent-encoding"}, Case{"file:///a%2", "percent-encoding"},
                        Case{"file:///a%00b", "NUL"}, Case{"file:///a%2Fb", "'/'"}}) {
    CAPTURE(c.uri);
    auto uri = parse_uri(c.uri);
    REQUIRE_FALSE(uri.is_ok());
    CHECK(uri.code() == StatusCode::INVALID_ARGUMENT);
    CHECK(uri.status().message().find(c.words) != std::string::npos);
  }
}

TEST_CASE("escape_path percent-encodes each segment so that parse_uri gives the path back") {
  for (const char* path : {"/mnt/kv/layer 17", "/a b%c/d#e?f,g", "/x/./y", "/\xC3\xA9/../a&b=c", "/"}) {
    CAPTURE(path);
    const std::string escaped = escape_path(path);
    CHECK(escaped.find_first_of(" #?,") == std::string::npos);  // none survives unencoded
    auto uri = parse_uri("file://" + escaped);
    REQUIRE_MESSAGE(uri.is_ok(), uri.status().to_string());
    CHECK(uri->path == path);
  }
  CHECK(escape_path("/a b/c,d") == "/a%20b/c%2Cd");
  CHECK(escape_path("/a//b") == "/a/b");
  CHECK(escape_path("/a b/") == "/a%20b");                                                      // trailing '/' dropped
  CHECK(escape_path("relative") == escape_path(std::filesystem::current_path() / "relative"));  // absolute
  CHECK(escape_path("").empty());  // nothing to name: "file://" alone is refused by the resolvers
}
