// leak_on_purpose: the one place where the library keeps memory alive forever, and tells
// LeakSanitizer so.
//
// Why: state that a device may still write into (a batch whose commands the controller never
// answered, a DMA mapping of a zombie command, a runtime destroyed with IO in flight) must never be
// freed; leaking it is the safe answer. Every such site calls this function, so a reader finds them
// all with one search and AddressSanitizer builds report no false leak.
// Thread-safety: safe from any thread.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define TUTTI_HAS_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TUTTI_HAS_LSAN 1
#endif
#endif
#if defined(TUTTI_HAS_LSAN)
#include <sanitizer/lsan_interface.h>
#endif

namespace tutti {

/// Keeps `object` (a heap allocation that is never deleted) out of LeakSanitizer's report.
template <class T>
void leak_on_purpose([[maybe_unused]] T* object) noexcept {
#if defined(TUTTI_HAS_LSAN)
  __lsan_ignore_object(object);
#endif
}

}  // namespace tutti
