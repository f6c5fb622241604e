// Generational opaque handles (MemoryHandle, TargetHandle, IoHandle) and the table that mints them.
//
// A handle is (runtime instance, slot, generation). Applications can copy and compare handles but
// cannot construct a non-null one: only a HandleTable mints them. A table
//   - rejects the null handle (INVALID_ARGUMENT),
//   - rejects a handle minted by another runtime instance (INVALID_ARGUMENT),
//   - rejects a handle whose slot was released since (NOT_FOUND: "stale"),
// and never reuses a generation for a slot: a slot whose generation counter would wrap is retired.
//
// Thread-safety: Handle is a plain value. HandleTable is NOT synchronised; its owner (the runtime)
// guards it with a mutex held only for the lookup, never across IO.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <tutti/core/status.hpp>

namespace tutti {

template <class Tag, class Value, class Owner>
class HandleTable;

/// An opaque, generational handle. 16 bytes. Default-constructed handles are null.
/// `Tag` makes handle kinds distinct types (a MemoryHandle is not a TargetHandle).
template <class Tag>
class Handle {
 public:
  constexpr Handle() noexcept = default;

  constexpr bool is_null() const noexcept { return instance_ == 0; }
  constexpr explicit operator bool() const noexcept { return !is_null(); }
  friend constexpr bool operator==(const Handle&, const Handle&) noexcept = default;

  /// A printable form for messages and logs, e.g. "memory#3.1"; not parseable back.
  std::string to_string() const {
    if (is_null()) return fmt::format("{}#null", Tag::name);
    return fmt::format("{}#{}.{}", Tag::name, slot_, generation_);
  }

 private:
  template <class, class, class>
  friend class HandleTable;
  constexpr Handle(std::uint64_t instance, std::uint32_t slot, std::uint32_t generation) noexcept
      : instance_(instance), slot_(slot), generation_(generation) {}

  std::uint64_t instance_ = 0;  // runtime instance id; 0 only for the null handle
  std::uint32_t slot_ = 0;
  std::uint32_t generation_ = 0;
};

struct MemoryTag {
  static constexpr std::string_view name = "memory";
};
struct TargetTag {
  static constexpr std::string_view name = "target";
};
struct IoTag {
  static constexpr std::string_view name = "io";
};

/// A registered memory region (StorageRuntime::register_memory).
using MemoryHandle = Handle<MemoryTag>;
/// An open target: a file or other storage object (StorageRuntime::open).
using TargetHandle = Handle<TargetTag>;
/// One submitted batch of IO (StorageRuntime::submit).
using IoHandle = Handle<IoTag>;

/// A process-unique, never-zero id for one runtime instance. 64 bits: never wraps in practice.
inline std::uint64_t next_instance_id() noexcept {
  static std::atomic<std::uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

/// Slots of `Value`s addressed by handles. Values live behind an owning pointer (`Owner`: a
/// std::unique_ptr, or a std::shared_ptr when others may keep a value alive past its handle), so a
/// pointer to a value stays valid until that value's handle is released, whatever else the table does.
template <class Tag, class Value, class Owner = std::unique_ptr<Value>>
class HandleTable {
 public:
  using handle_type = Handle<Tag>;

  explicit HandleTable(std::uint64_t instance_id) noexcept : instance_(instance_id) {}

  /// Stores a value and mints its handle. RESOURCE_EXHAUSTED when every slot id is used.
  Result<handle_type> insert(Owner value) {
    std::uint32_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      if (slots_.size() >= std::numeric_limits<std::uint32_t>::max())
        return error(StatusCode::RESOURCE_EXHAUSTED, "{} table is full ({} slots)", Tag::name, slots_.size());
      slot = static_cast<std::uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    Slot& s = slots_[slot];
    s.value = std::move(value);
    ++live_;
    return handle_type(instance_, slot, s.generation);
  }

  /// The value of a live handle, or INVALID_ARGUMENT (null / foreign) or NOT_FOUND (stale).
  /// `field` names the field in the message: a string ("requests[3].memory") or anything {fmt} can
  /// format, which is formatted only when the handle is refused (a live handle costs no formatting).
  template <class Field>
  Result<Value*> find(handle_type handle, const Field& field) const {
    if (Status refused = check(handle, field); !refused.is_ok()) return refused;
    return slots_[handle.slot_].value.get();
  }

  /// A copy of the owning pointer of a live handle's value (for shared owners: the value then stays
  /// alive after the handle is released), or the errors of find().
  template <class Field>
  Result<Owner> owner(handle_type handle, const Field& field) const {
    if (Status refused = check(handle, field); !refused.is_ok()) return refused;
    return slots_[handle.slot_].value;
  }

  /// Removes a live handle's value and returns it. The slot's generation moves on, so the old
  /// handle (and every copy of it) becomes stale. Precondition: find(handle) succeeded.
  Owner erase(handle_type handle) {
    Slot& s = slots_[handle.slot_];
    Owner value = std::move(s.value);
    --live_;
    if (s.generation == std::numeric_limits<std::uint32_t>::max()) return value;  // retire the slot
    ++s.generation;
    free_.push_back(handle.slot_);
    return value;
  }

  /// Calls f(handle, value&) for every live value.
  template <class F>
  void for_each(F&& f) {
    for (std::uint32_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].value) f(handle_type(instance_, i, slots_[i].generation), *slots_[i].value);
  }

  std::size_t size() const noexcept { return live_; }

 private:
  template <class Field>
  Status check(handle_type handle, const Field& field) const {
    if (handle.is_null()) return error(StatusCode::INVALID_ARGUMENT, "{} is a null {} handle", field, Tag::name);
    if (handle.instance_ != instance_)
      return error(StatusCode::INVALID_ARGUMENT, "{} = {} belongs to another runtime instance", field,
                   handle.to_string());
    if (handle.slot_ >= slots_.size() || slots_[handle.slot_].generation != handle.generation_ ||
        !slots_[handle.slot_].value)
      return error(StatusCode::NOT_FOUND, "{} = {} is stale: it was closed or released", field, handle.to_string());
    return Status::success();
  }

  struct Slot {
    std::uint32_t generation = 1;
    Owner value;
  };
  std::uint64_t instance_;
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_;
  std::size_t live_ = 0;
};

}  // namespace tutti
