// tuttid's count of leased queues (daemon/src/leased_queues.hpp), shared by soft and PCI controllers: counted
// per lease, so a QID two leases list (a PCI holder destroyed its own queue group and the driver gave the QID
// to the next lease) neither under-counts queues_in_use nor lets the end of one lease remove another's queue.
#include <doctest/doctest.h>

#include <vector>

#include "leased_queues.hpp"

using tutti::daemon::LeasedQueues;

TEST_CASE("a QID the driver gives to a second lease while the first still lists it counts twice") {
  LeasedQueues leased;
  leased.add({5, 6});  // lease 1; its holder then destroys the group of QID 5, which frees 5 in the driver
  leased.add({5});     // lease 2 gets QID 5 again
  CHECK(leased.size() == 3);
  CHECK(leased.distinct() == std::vector<std::uint16_t>{5, 6});
  CHECK(leased.remove({5, 6}) == 0);  // lease 1 ends
  CHECK(leased.size() == 1);          // lease 2 still holds QID 5
  CHECK(leased.distinct() == std::vector<std::uint16_t>{5});
  CHECK(leased.remove({5}) == 0);  // lease 2 ends
  CHECK(leased.size() == 0);
}

TEST_CASE("a lease counted out twice removes nothing the second time") {
  LeasedQueues leased;
  leased.add({1, 2});
  CHECK(leased.remove({1, 2}) == 0);
  CHECK(leased.remove({1, 2}) == 2);
  CHECK(leased.size() == 0);
  CHECK_FALSE(leased.remove_one(1));
}

TEST_CASE("soft mode: distinct QIDs, one entry each, removed one at a time") {
  LeasedQueues leased;
  leased.add({3});
  leased.add({4});
  CHECK(leased.size() == 2);
  CHECK(leased.remove_one(3));
  CHECK_FALSE(leased.remove_one(3));
  CHECK(leased.size() == 1);
  leased.clear();
  CHECK(leased.size() == 0);
}
