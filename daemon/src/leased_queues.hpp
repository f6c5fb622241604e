// The I/O queue pairs leased on one controller, counted per lease (docs/daemon.md, "PCI controllers"):
// ControllerSlot's queues_in_use, the leasable_queues limit and the metrics come from it.
//
// A QID may be listed by two leases at once: the snvme driver lets a sealed lease file destroy its own
// queue groups (DESTROY_QUEUE_GROUP), which frees their QIDs in the driver while the lease still holds its
// queues in tuttid's count, and the driver may give such a QID to the next lease. So every lease's QIDs are
// entries of their own (a multiset): a QID two leases list counts twice, and the end of a lease removes one
// entry per QID it lists, never another lease's. The count never falls below what the live leases were
// granted; it may exceed what the driver holds for them (a holder's own DESTROY_QUEUE_GROUP gives back
// nothing before its lease ends).
// Thread-safety: one thread (the daemon's loop) uses a LeasedQueues.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

namespace tutti::daemon {

class LeasedQueues {
 public:
  /// Counts the QIDs of one lease (one entry each, whatever other leases list).
  void add(const std::vector<std::uint16_t>& qids) { qids_.insert(qids.begin(), qids.end()); }
  /// Removes one entry of `qid`; false when there was none.
  bool remove_one(std::uint16_t qid) {
    auto it = qids_.find(qid);
    if (it == qids_.end()) return false;
    qids_.erase(it);
    return true;
  }
  /// Removes one entry per QID of one lease; returns how many had none.
  std::size_t remove(const std::vector<std::uint16_t>& qids) {
    std::size_t missing = 0;
    for (auto qid : qids) missing += remove_one(qid) ? 0 : 1;
    return missing;
  }
  /// Entries: the queues the live leases were granted.
  std::uint32_t size() const noexcept { return static_cast<std::uint32_t>(qids_.size()); }
  /// The distinct QIDs (ascending).
  std::vector<std::uint16_t> distinct() const {
    std::vector<std::uint16_t> v;
    for (auto it = qids_.begin(); it != qids_.end(); it = qids_.upper_bound(*it)) v.push_back(*it);
    return v;
  }
  void clear() noexcept { qids_.clear(); }

 private:
  std::multiset<std::uint16_t> qids_;
};

}  // namespace tutti::daemon
