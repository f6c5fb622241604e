// Memory scope and memory order: the vocabulary of every accel atomic and fence.
//
// Scope says which threads must observe an atomic operation coherently (CUDA PTX ISA 8.x,
// "Memory Consistency Model: Scope"):
//   thread  - only the calling thread (a compiler barrier, no hardware ordering);
//   block   - threads of the same thread block (CTA);
//   device  - every thread of the same GPU (host profile: every host thread);
//   system  - every agent of the system: other GPUs, host threads, and devices doing DMA (the
//             NVMe controller reading SQEs and doorbells). Queue memory shared with a controller
//             must use system scope.
// Order follows C++ std::memory_order. In the host profile every scope behaves as system scope:
// host threads, the soft controller and kernels-as-host-threads all share coherent memory.
#pragma once

#include <cstdint>

namespace tutti::accel {

/// Which threads must see an atomic operation coherently; see the header comment.
enum class ThreadScope : std::uint8_t { thread, block, device, system };

/// Memory order, as std::memory_order.
enum class MemoryOrder : std::uint8_t { relaxed, acquire, release, acq_rel, seq_cst };

}  // namespace tutti::accel
