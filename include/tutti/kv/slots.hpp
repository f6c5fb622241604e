// Slot allocation and eviction of a KV store: which slot each block occupies, which are free, and
// CLOCK (second chance) over the visible, unpinned ones when a new block needs a slot.
//
//   FREE     no block; on the free list
//   PENDING  a block being stored (some layers written, not visible yet); never evicted
//   VISIBLE  a committed block; evictable while pins == 0
//
// A lookup or load hit sets the slot's reference bit; the clock hand clears it once and evicts the
// slot it finds unreferenced on its next pass (at most two sweeps per victim). Pins: loads and stores
// in flight, and pin() calls, each add one; evict and the clock skip pinned slots.
// Thread-safety: none; the store guards it with its mutex.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace tutti::kv {

enum class SlotState : std::uint8_t { FREE, PENDING, VISIBLE };

struct Slot {
  SlotState state = SlotState::FREE;
  bool referenced = false;
  std::uint32_t pins = 0;
  std::uint64_t generation = 0;
  /// The block's key while PENDING or VISIBLE: a view of the key of its entry in the store's map of
  /// pending or visible blocks (node-based, so the view stays valid while the entry exists; the
  /// store sets it when it inserts the entry).
  std::string_view key;
};

class SlotTable {
 public:
  explicit SlotTable(std::uint64_t slots) : slots_(slots) {
    free_.reserve(slots);
    for (std::uint64_t s = slots; s-- > 0;) free_.push_back(static_cast<std::uint32_t>(s));  // slot 0 first
  }

  std::uint64_t size() const noexcept { return slots_.size(); }
  Slot& operator[](std::uint32_t s) { return slots_[s]; }
  const Slot& operator[](std::uint32_t s) const { return slots_[s]; }
  std::uint64_t free_count() const noexcept { return free_.size(); }

  /// Marks slot `s` VISIBLE during recovery (it must be FREE); false when it is not.
  bool claim_visible(std::uint32_t s, std::uint64_t generation) {
    if (s >= slots_.size() || slots_[s].state != SlotState::FREE) return false;
    slots_[s] = Slot{SlotState::VISIBLE, false, 0, generation, {}};
    return true;
  }
  /// Rebuilds the free list after claim_visible calls.
  void rebuild_free_list() {
    free_.clear();
    for (std::uint64_t s = slots_.size(); s-- > 0;)
      if (slots_[s].state == SlotState::FREE) free_.push_back(static_cast<std::uint32_t>(s));
  }

  /// A free slot, now PENDING; nullopt when none is free.
  std::optional<std::uint32_t> take_free() {
    if (free_.empty()) return std::nullopt;
    const std::uint32_t s = free_.back();
    free_.pop_back();
    slots_[s] = Slot{SlotState::PENDING, false, 0, 0, {}};
    return s;
  }

  /// The next CLOCK victim: a VISIBLE, unpinned slot whose reference bit was clear (bits of the
  /// slots passed are cleared). Excludes slots already chosen (`chosen`, state unchanged until the
  /// caller evicts them). nullopt when every visible slot is pinned or chosen.
  std::optional<std::uint32_t> next_victim(const std::vector<bool>& chosen) {
    const std::uint64_t n = slots_.size();
    for (std::uint64_t step = 0; step < 2 * n; ++step) {
      const std::uint32_t s = static_cast<std::uint32_t>(hand_);
      hand_ = (hand_ + 1) % n;
      Slot& slot = slots_[s];
      if (slot.state != SlotState::VISIBLE || slot.pins > 0 || chosen[s]) continue;
      if (slot.referenced) {
        slot.referenced = false;
        continue;
      }
      return s;
    }
    return std::nullopt;
  }

  /// Returns slot `s` to the free list.
  void release(std::uint32_t s) {
    slots_[s] = Slot{};
    free_.push_back(s);
  }

 private:
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_;
  std::uint64_t hand_ = 0;
};

}  // namespace tutti::kv
