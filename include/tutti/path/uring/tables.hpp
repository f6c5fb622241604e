// The registered file table and the sparse fixed buffer table of the uring DataPath. Part of
// tutti/path/uring.hpp (include that).
//
// Both tables are registered sparse at ring creation (io_uring_register_files_sparse,
// io_uring_register_buffers_sparse) with Options::registered_files / fixed_buffers slots. open() puts a
// target's fd into a free slot (IOSQE_FIXED_FILE); register_memory() puts a HOST / PINNED_HOST region
// of at most 1 GiB into a free buffer slot (IORING_OP_READ_FIXED / WRITE_FIXED). When a table is
// missing or full, or the kernel refuses (RLIMIT_MEMLOCK ...), the object uses a plain fd / plain
// reads and writes and records why (OpenTarget::registered_file_fallback,
// RegisteredMemory::fixed_buffer_fallback). A slot the kernel may still hold is never handed out again.
//
// Thread-safety: every member function may be called from any thread (one mutex guards the free lists).
#pragma once

#include <sys/uio.h>

#include <cerrno>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <tutti/bind/file.hpp>
#include <tutti/core/errno.hpp>
#include <tutti/core/status.hpp>
#include <tutti/path/uring/options.hpp>
#include <tutti/path/uring/ring.hpp>
#include <tutti/path/uring/state.hpp>
#include <tutti/path/uring/stats.hpp>

namespace tutti::uring::detail {

/// The kernel's limit on one fixed buffer (io_uring: 1 GiB per registered iovec).
inline constexpr std::uint64_t kMaxFixedBufferBytes = std::uint64_t{1} << 30;

class RegisteredTables {
 public:
  /// Registers both sparse tables on `ring`; a table the kernel refuses is simply absent.
  void create(Ring& ring, const Options& options) {
    registered_files_ = options.registered_files;
    fixed_buffers_ = options.fixed_buffers;
    if (options.registered_files > 0 && io_uring_register_files_sparse(ring.get(), options.registered_files) == 0) {
      file_table_ = true;
      for (int i = static_cast<int>(options.registered_files) - 1; i >= 0; --i) free_file_slots_.push_back(i);
    }
    if (options.fixed_buffers > 0) {
      const int b = io_uring_register_buffers_sparse(ring.get(), options.fixed_buffers);
      if (b == 0) {
        buffer_table_ = true;
        for (int i = static_cast<int>(options.fixed_buffers) - 1; i >= 0; --i) free_buffer_slots_.push_back(i);
      } else {
        buffer_table_error_ = fmt::format("io_uring_register_buffers_sparse: {}", file::errno_text(-b));
      }
    } else {
      buffer_table_error_ = "Options::fixed_buffers = 0";
    }
  }

  /// The table flags of Stats.
  void copy_to(Stats& s) const {
    s.registered_file_table = file_table_;
    s.fixed_buffer_table = buffer_table_;
    s.fixed_buffer_table_error = buffer_table_error_;
  }

  /// Puts the target's fd into a free slot, or records why it stays a plain fd.
  void register_file(Ring& ring, OpenTarget& target, Counters& counters) {
    const char* refusal = file_table_ ? "" : "no registered file table (Options::registered_files = 0 or refused)";
    target.registered_file_index =
        place(free_file_slots_, refusal, "registered file table", registered_files_, "io_uring_register_files_update",
              target.registered_file_fallback, [&](int slot) {
                int fd = target.file.fd.get();
                return io_uring_register_files_update(ring.get(), static_cast<unsigned>(slot), &fd, 1);
              });
    if (target.registered_file_index < 0) counters.registered_file_fallbacks.fetch_add(1);
  }

  /// Empties the target's slot; the slot is reused only when the kernel confirmed it.
  void unregister_file(Ring& ring, OpenTarget& target) {
    if (target.registered_file_index < 0) return;
    int none = -1;
    const int rc =
        io_uring_register_files_update(ring.get(), static_cast<unsigned>(target.registered_file_index), &none, 1);
    if (rc == 1) {  // a slot the kernel still holds is never handed out again
      std::scoped_lock lock(mutex_);
      free_file_slots_.push_back(target.registered_file_index);
    }
    target.registered_file_index = -1;
  }

  /// Registers the region as a fixed buffer, or records why it uses plain reads and writes.
  void register_buffer(Ring& ring, RegisteredMemory& memory, Counters& counters) {
    std::string refusal;
    if (!buffer_table_)
      refusal = fmt::format("no fixed buffer table ({})", buffer_table_error_);
    else if (memory.view.size > kMaxFixedBufferBytes)
      refusal = fmt::format("region of {} bytes exceeds the {}-byte fixed buffer limit", memory.view.size,
                            kMaxFixedBufferBytes);
    memory.fixed_buffer_index =
        place(free_buffer_slots_, refusal, "fixed buffer table", fixed_buffers_, "io_uring_register_buffers_update_tag",
              memory.fixed_buffer_fallback, [&](int slot) {
                iovec vector{memory.view.address, static_cast<std::size_t>(memory.view.size)};
                __u64 tag = 0;
                return io_uring_register_buffers_update_tag(ring.get(), static_cast<unsigned>(slot), &vector, &tag, 1);
              });
    (memory.fixed_buffer_index >= 0 ? counters.fixed_buffer_registrations : counters.fixed_buffer_fallbacks)
        .fetch_add(1);
  }

  /// Removes the region's fixed buffer from the kernel's table. Errors: the kernel's refusal (the
  /// slot is then never reused).
  Status unregister_buffer(Ring& ring, RegisteredMemory& memory) {
    if (memory.fixed_buffer_index < 0) return Status::success();
    iovec empty{nullptr, 0};
    __u64 tag = 0;
    const int rc = io_uring_register_buffers_update_tag(ring.get(), static_cast<unsigned>(memory.fixed_buffer_index),
                                                        &empty, &tag, 1);
    if (rc != 1)
      return status_from_errno(rc < 0 ? -rc : EIO,
                               fmt::format("removing fixed buffer {} ({} bytes at {})", memory.fixed_buffer_index,
                                           memory.view.size, memory.view.address));
    std::scoped_lock lock(mutex_);
    free_buffer_slots_.push_back(memory.fixed_buffer_index);
    memory.fixed_buffer_index = -1;
    return Status::success();
  }

 private:
  /// Takes a free slot of `free_slots` and has the kernel fill it (`update(slot)`: an
  /// io_uring_register_*_update call, 1 on success or -errno). Returns the slot, or -1 with `fallback`
  /// saying why: `refusal` when not empty (no table, a region too large), the table full, or the
  /// kernel's errno text (the slot then goes back to the free list).
  template <class Update>
  int place(std::vector<int>& free_slots, std::string_view refusal, std::string_view table, std::uint32_t slots,
            std::string_view call, std::string& fallback, Update&& update) {
    int slot = -1;
    {
      std::scoped_lock lock(mutex_);
      if (!refusal.empty())
        fallback = std::string(refusal);
      else if (free_slots.empty())
        fallback = fmt::format("{} full ({} slots)", table, slots);
      else {
        slot = free_slots.back();
        free_slots.pop_back();
      }
    }
    if (slot < 0) return -1;
    const int rc = update(slot);
    if (rc == 1) return slot;
    fallback = fmt::format("{}: {}", call, file::errno_text(rc < 0 ? -rc : EIO));
    std::scoped_lock lock(mutex_);
    free_slots.push_back(slot);
    return -1;
  }

  std::mutex mutex_;  // the free lists
  std::vector<int> free_file_slots_, free_buffer_slots_;
  bool file_table_ = false, buffer_table_ = false;
  std::string buffer_table_error_;
  std::uint32_t registered_files_ = 0, fixed_buffers_ = 0;
};

}  // namespace tutti::uring::detail
