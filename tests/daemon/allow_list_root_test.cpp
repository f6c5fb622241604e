// tuttid's allow lists against SO_PEERCRED, with a client process that really runs as `nobody` (needs root to
// switch users; the suite is skipped with 77 otherwise).
#include <doctest/doctest.h>
#include <grp.h>

#include <sys/stat.h>

#include "daemon_harness.hpp"

using namespace tutti::daemon::testing;
using tutti::daemon::Connection;

namespace {

constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;

void become_nobody() {
  if (::setgroups(0, nullptr) != 0 || ::setgid(kNogroup) != 0 || ::setuid(kNobody) != 0) ::_exit(3);
}

json acquire_one(Connection& c) {
  auto r = c.call(acquire_request(1), kCallTimeoutNs);
  return r.is_ok() ? *r : json{{"call_error", r.status().to_string()}};
}

}  // namespace

TEST_CASE("a user not on the allow list is refused, by uid from SO_PEERCRED, with a clear message") {
  TestDaemon d("", R"("group": "nogroup")");  // nobody may connect (socket group), but is not on allow.users
  ClientProcess nobody(d.socket_path(), acquire_one, become_nobody);
  const json r = nobody.result();
  INFO(r.dump());
  CHECK(r["ok"] == false);
  CHECK(r["error"]["code"] == "permission_denied");
  const std::string m = r["error"]["message"];
  CHECK(m.find("uid 65534") != std::string::npos);
  CHECK(m.find("not on the allow list of controller soft0") != std::string::npos);
  // Read-only requests are open to whoever can connect.
  ClientProcess reader(
      d.socket_path(),
      [](Connection& c) {
        return *c.call({{"tutti", 1}, {"op", "status"}}, kCallTimeoutNs);
      },
      become_nobody);
  CHECK(reader.result()["ok"] == true);
  // drain is for root and tuttid's own user only.
  ClientProcess drainer(
      d.socket_path(),
      [](Connection& c) {
        return *c.call({{"tutti", 1}, {"op", "drain"}}, kCallTimeoutNs);
      },
      become_nobody);
  CHECK(drainer.result()["error"]["code"] == "permission_denied");
  CHECK(d.call({{"tutti", 1}, {"op", "status"}})["draining"] == false);
}

TEST_CASE("a group on the allow list admits its members (SO_PEERCRED gid and SO_PEERGROUPS)") {
  TestDaemon d(R"("allow": {"groups": ["nogroup"]})", R"("group": "nogroup")");
  ClientProcess nobody(d.socket_path(), acquire_one, become_nobody);
  const json r = nobody.result();
  INFO(r.dump());
  CHECK(r["ok"] == true);
  CHECK(d.call({{"tutti", 1}, {"op", "leases"}})["leases"][0]["uid"] == kNobody);
}

TEST_CASE("a user outside the socket's group cannot even connect (mode 0660)") {
  TestDaemon d;  // socket group: the daemon's (root)
  ClientProcess nobody(d.socket_path(), acquire_one, become_nobody);
  const json r = nobody.result();
  INFO(r.dump());
  REQUIRE(r.contains("connect_error"));
  CHECK(r["connect_error"].get<std::string>().find("Permission denied") != std::string::npos);
}
