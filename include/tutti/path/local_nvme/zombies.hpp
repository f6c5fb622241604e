// Zombie commands of the local_nvme DataPath (docs/local-nvme.md, "Timeouts"): a command that
// timed out, was aborted (NVMe Abort, Base 2.0, 5.1) and still got no completion within
// abort_timeout_ns. Its credit, its CID and the DMA mapping it may still transfer into stay
// reserved until its completion finally arrives, or until the DataPath deletes its queues (Base
// 2.0, 5.6: SQ deletion ends every command in it); a mapping with zombies makes
// unregister_memory return BUSY and outlives the registration object.
// Thread-safety: every member function takes the list's mutex; reap() touches queue words the
// kernels also update, so its caller must hold the DataPath's kernel gate exclusively (no kernel
// of any batch running).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <tutti/core/leak.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/path/local_nvme/kernels.hpp>
#include <tutti/path/local_nvme/queues.hpp>
#include <tutti/path/local_nvme/registration.hpp>

namespace tutti::local_nvme {

/// One command without a completion: where it waits and what it may still touch.
struct Zombie {
  std::uint32_t queue_index;
  std::uint16_t cid;
  std::shared_ptr<Mapping> mapping;  ///< null for Flush
};

/// The DataPath's zombie commands.
class ZombieList {
 public:
  /// Takes over the zombie records of one request (`records`, as copied back after a poll
  /// kernel, on queue `queue_index`); each keeps `mapping` alive and counted.
  void hand_off(std::uint32_t queue_index, const std::vector<CommandRecord>& records,
                const std::shared_ptr<Mapping>& mapping) {
    for (const CommandRecord& rec : records) {
      if (rec.phase != CommandPhase::zombie) continue;
      if (mapping) mapping->zombies.fetch_add(1);
      std::scoped_lock lock(mutex_);
      zombies_.push_back(Zombie{queue_index, rec.cid, mapping});
    }
  }

  /// Frees zombies whose completion arrived: their credit returns, their mapping may go. The
  /// caller holds the kernel gate exclusively (see the file comment). Never waits. A zombie on a
  /// pair whose queue memory the host cannot reach (QueuePairInfo::host_accessible false: device
  /// memory, where a CPU load faults) is left as it is: its credit, CID and mapping stay reserved
  /// until the pair is deleted (release()).
  void reap(const std::vector<std::unique_ptr<Queue>>& queues) {
    std::scoped_lock lock(mutex_);
    for (std::size_t i = 0; i < zombies_.size();) {
      Queue& q = *queues[zombies_[i].queue_index];
      if (!q.info.host_accessible) {
        ++i;
        continue;
      }
      q.storage->queue().reap_completions();
      nvme::CompletionQueueEntry cqe{};
      if (q.storage->queue().take_completion(zombies_[i].cid, cqe)) {
        detail::return_credits(q.credits, 1);
        if (zombies_[i].mapping) zombies_[i].mapping->zombies.fetch_sub(1);
        zombies_[i] = std::move(zombies_.back());
        zombies_.pop_back();
      } else {
        ++i;
      }
    }
  }

  /// Commands still without a completion.
  std::size_t size() {
    std::scoped_lock lock(mutex_);
    return zombies_.size();
  }

  /// Drops every zombie once its queues are gone. `queues_deleted`: the controller confirmed the
  /// deletion of every queue pair (their commands ended); otherwise it might still DMA for a
  /// zombie, so each zombie's mapping is leaked on purpose rather than unmapped.
  void release(bool queues_deleted) {
    std::scoped_lock lock(mutex_);
    if (!queues_deleted)
      for (Zombie& z : zombies_)
        if (z.mapping) leak_on_purpose(new std::shared_ptr<Mapping>(std::move(z.mapping)));
    zombies_.clear();  // the mappings may go now
  }

 private:
  std::mutex mutex_;
  std::vector<Zombie> zombies_;
};

}  // namespace tutti::local_nvme
