// The cuFile baseline (CUDA profile, built only where libcufile and cufile.h exist: meson's
// cufile_dep, which defines TUTTI_HAVE_CUFILE=1): reads byte ranges of files into GPU memory with
// NVIDIA's libcufile (GPUDirect Storage), the reference every Tutti GPU figure is compared with.
// Header-only so that any benchmark or example can use it with `dependencies: cufile_dep` and
// `include_directories('<root>/bench/support')`.
//
//   #include "cufile_reader.hpp"
//   namespace cf = tutti::bench::cufile;
//   auto driver = cf::Driver::open({});                      // cuFileDriverOpen on device 0, compat mode allowed
//   std::printf("%s\n", (*driver)->info().describe().c_str());  // "compat mode (nvidia-fs not loaded) ..."
//   auto file = cf::File::open("/data/kv/layer00");           // O_DIRECT fd + cuFileHandleRegister
//   auto buffer = cf::DeviceBuffer::register_range(device_pointer, bytes);  // cuFileBufRegister
//   std::vector<cf::Range> ranges{{file->get(), 0, 0, 512 << 10}, ...};  // file, file offset, device offset, bytes
//   cf::ReadOptions options;                                  // threads = 16 reads in flight, 60 s budget
//   auto report = cf::read(**buffer, ranges, options);
//   // report->bytes, report->seconds(), report->gigabytes_per_second()
//
// Modes: without the nvidia-fs kernel module (GPU machines without GDS support), cuFile runs in
// *compat mode*: it reads the file with POSIX IO into its own pinned bounce buffers and copies them
// to the GPU with cudaMemcpy. Driver::open allows compat mode (cuFileSetParameterBool
// CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE = true, the same as `properties.allow_compat_mode` in
// cufile.json) unless told not to, and forces it (CUFILE_PARAM_FORCE_COMPAT_MODE) where nvidia-fs is
// not loaded (Options::force_compat_without_nvidia_fs); when the driver still refuses, it writes a cufile.json with
// `"allow_compat_mode": true` and points CUFILE_ENV_PATH_JSON at it, then retries once. DriverInfo
// records which mode was in effect and why, so a figure can never claim GPUDirect by accident.
//
// Queue depth: cuFileRead is synchronous; read() keeps `threads` reads in flight with that many
// worker threads, each taking the next range (cuFile's reads are thread-safe; the batch API needs
// nvidia-fs and is not used). Units: bytes, ns; GB/s is 10^9 bytes per second.
//
// Known refusal: cuFile 1.15 looks up the file's block device in the udev database (ID_FS_USAGE ...)
// even in compat mode; where udev has no entry (an H200 VM with a virtio disk, 2026-11-30),
// cuFileHandleRegister fails with CU_FILE_HANDLE_NOT_REGISTERED for O_DIRECT and buffered fds alike,
// and File::open says so. The uring DataPath has no such dependency.
//
// Errors: every libcufile / CUDA / POSIX call's failure becomes a Status naming the call, the
// operation and the cuFile or errno text (CUfileOpError via cufileop_status_error; -1 with errno
// via errno_text): UNSUPPORTED (no GPUDirect and compat mode refused, unsupported file), NOT_FOUND
// (missing file), INVALID_ARGUMENT (bad ranges, options), OUT_OF_RANGE (a range past the end of the
// file or of the registered buffer, or a read that hit end of file), TIMEOUT (the budget ran out:
// ranges not started are skipped, none still runs when read() returns), DEVICE_ERROR (anything
// else). A failed read() never reports bytes that did not arrive.
//
// Thread-safety: Driver is process-wide (one at a time, like cuFileDriverOpen's reference count);
// File and DeviceBuffer may be used by several read() calls at once; read() is reentrant.
#pragma once

#if !defined(TUTTI_HAVE_CUFILE)
#error "cufile_reader.hpp needs libcufile: build it only when meson's cufile_dep.found()"
#endif

#include <cuda_runtime.h>
#include <cufile.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <tutti/bind/file.hpp>
#include <tutti/core/errno.hpp>
#include <tutti/core/status.hpp>

namespace tutti::bench::cufile {

/// A Status for a cuFile control call (CUfileError_t): OK, or the CUfileOpError text (and the CUDA
/// driver error when err is CU_FILE_CUDA_DRIVER_ERROR), naming `call`.
inline Status status_of(CUfileError_t result, std::string_view call) {
  if (result.err == CU_FILE_SUCCESS) return Status::success();
  StatusCode code = StatusCode::DEVICE_ERROR;
  switch (result.err) {
    case CU_FILE_DRIVER_NOT_INITIALIZED:
    case CU_FILE_PLATFORM_NOT_SUPPORTED:
    case CU_FILE_IO_NOT_SUPPORTED:
    case CU_FILE_DEVICE_NOT_SUPPORTED:
    case CU_FILE_INVALID_FILE_TYPE:
    case CU_FILE_INVALID_FILE_OPEN_FLAG:
    case CU_FILE_IO_DISABLED: code = StatusCode::UNSUPPORTED; break;
    case CU_FILE_INVALID_VALUE:
    case CU_FILE_CUDA_POINTER_INVALID:
    case CU_FILE_CUDA_MEMORY_TYPE_INVALID:
    case CU_FILE_CUDA_POINTER_RANGE_ERROR:
    case CU_FILE_MEMORY_ALREADY_REGISTERED:
    case CU_FILE_HANDLE_ALREADY_REGISTERED: code = StatusCode::INVALID_ARGUMENT; break;
    case CU_FILE_NOMEM_ERROR:
    case CU_FILE_GPU_MEMORY_PINNING_FAILED:
    case CU_FILE_INVALID_MAPPING_SIZE: code = StatusCode::RESOURCE_EXHAUSTED; break;
    default: break;
  }
  if (result.err == CU_FILE_CUDA_DRIVER_ERROR)  // CUresult by number: naming it would need libcuda at link time
    return error(code, "{} failed: {} (CUresult {})", call, cufileop_status_error(result.err),
                 static_cast<int>(result.cu_err));
  return error(code, "{} failed: {} (CUfileOpError {})", call, cufileop_status_error(result.err),
               static_cast<int>(result.err));
}

/// A Status for a negative cuFileRead / cuFileWrite result: -1 means errno (POSIX error), any
/// other negative value is -CUfileOpError.
inline Status status_of_io(ssize_t result, int saved_errno, std::string_view what) {
  if (result == -1) return error(StatusCode::DEVICE_ERROR, "{}: {}", what, file::errno_text(saved_errno));
  CUfileError_t e{};
  e.err = static_cast<CUfileOpError>(-result);
  return status_of(e, what);
}

/// A Status for a CUDA runtime call.
inline Status cuda_status_of(cudaError_t code, std::string_view call) {
  if (code == cudaSuccess) return Status::success();
  return error(StatusCode::DEVICE_ERROR, "{} failed: {} ({})", call, cudaGetErrorString(code), cudaGetErrorName(code));
}

/// Which data path cuFile used.
enum class Mode : std::uint8_t {
  GPUDIRECT,  ///< nvidia-fs loaded and compat mode not forced: DMA from storage into GPU memory.
  COMPAT,     ///< POSIX reads into cuFile's pinned bounce buffers + cudaMemcpy (no nvidia-fs, or forced).
};

inline std::string_view to_string(Mode m) noexcept { return m == Mode::GPUDIRECT ? "GPUDirect" : "compat"; }

/// What the driver reported after cuFileDriverOpen.
struct DriverInfo {
  int library_version = 0;          ///< cuFileGetVersion: 1000 x major + 10 x minor (1150 = 1.15).
  bool nvidia_fs_loaded = false;    ///< /proc/driver/nvidia-fs/version exists.
  bool allow_compat_mode = false;   ///< CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE in effect.
  bool force_compat_mode = false;   ///< CUFILE_PARAM_FORCE_COMPAT_MODE in effect.
  unsigned nvfs_major_version = 0;  ///< CUfileDrvProps_t::nvfs.major_version (0 without nvidia-fs).
  unsigned nvfs_minor_version = 0;
  Mode mode = Mode::COMPAT;  ///< COMPAT unless nvidia-fs is loaded and compat is not forced.
  std::string config_json;   ///< CUFILE_ENV_PATH_JSON in effect ("" = the default /etc/cufile.json).

  /// One line for logs and benchmark output, e.g.
  /// "cuFile 1.15, compat mode (nvidia-fs not loaded; allow_compat_mode = true), config /etc/cufile.json".
  std::string describe() const {
    return fmt::format("cuFile {}.{}, {} mode ({}; allow_compat_mode = {}, force_compat_mode = {}), config {}",
                       library_version / 1000, library_version % 1000 / 10, to_string(mode),
                       nvidia_fs_loaded ? fmt::format("nvidia-fs {}.{} loaded", nvfs_major_version, nvfs_minor_version)
                                        : std::string("nvidia-fs not loaded"),
                       allow_compat_mode, force_compat_mode, config_json.empty() ? "/etc/cufile.json" : config_json);
  }
};

/// The process's cuFile driver (cuFileDriverOpen .. cuFileDriverClose). Open one before any File or
/// DeviceBuffer and destroy it after them.
class Driver {
 public:
  struct Options {
    int device = 0;                  ///< CUDA device made current (cudaSetDevice) before the open.
    bool allow_compat_mode = true;   ///< Allow compat mode (needed without nvidia-fs).
    bool force_compat_mode = false;  ///< Use compat mode even where nvidia-fs is loaded.
    /// Force compat mode where the nvidia-fs module is not loaded (compat is then the only path, and
    /// cuFile 1.15 merely *allowed* to use it refuses cuFileHandleRegister on such machines with
    /// CU_FILE_HANDLE_NOT_REGISTERED, seen on an H200 VM with a virtio disk).
    bool force_compat_without_nvidia_fs = true;
    /// Where to write a fallback cufile.json when the first open is refused ("" = a file under
    /// $TMPDIR or /tmp). Also used, when it names an existing file, as CUFILE_ENV_PATH_JSON up front.
    std::string config_json_path;
  };

  /// Opens the driver. Errors: INVALID_ARGUMENT (device < 0), DEVICE_ERROR (cudaSetDevice, a
  /// CUDA context that cannot be created), UNSUPPORTED (no nvidia-fs and compat mode refused,
  /// GPUDirect unsupported on this platform), or cuFile's error naming the call.
  static Result<std::unique_ptr<Driver>> open(const Options& options) {
    if (options.device < 0)
      return error(StatusCode::INVALID_ARGUMENT, "Driver::Options::device = {} must be >= 0", options.device);
    TUTTI_RETURN_IF_ERROR(cuda_status_of(cudaSetDevice(options.device), "cudaSetDevice"));
    TUTTI_RETURN_IF_ERROR(cuda_status_of(cudaFree(nullptr), "cudaFree(nullptr) (creating the CUDA context)"));
    auto driver = std::unique_ptr<Driver>(new Driver());
    if (!options.config_json_path.empty() && ::access(options.config_json_path.c_str(), R_OK) == 0)
      ::setenv("CUFILE_ENV_PATH_JSON", options.config_json_path.c_str(), 1);
    Status opened = open_once(options);
    if (!opened.is_ok() && options.allow_compat_mode) {
      // The default configuration refused compat mode: write one that allows it and retry once.
      std::string path = options.config_json_path;
      if (path.empty()) {
        const char* tmp = std::getenv("TMPDIR");
        path = fmt::format("{}/tutti-cufile-{}.json", tmp && *tmp ? tmp : "/tmp", ::getpid());
      }
      TUTTI_RETURN_IF_ERROR(write_compat_config(path).with_context(opened.message()));
      ::setenv("CUFILE_ENV_PATH_JSON", path.c_str(), 1);
      opened = open_once(options).with_context(fmt::format("after writing {} with allow_compat_mode = true", path));
    }
    TUTTI_RETURN_IF_ERROR(opened);
    driver->open_ = true;
    DriverInfo& info = driver->info_;
    (void)cuFileGetVersion(&info.library_version);
    info.nvidia_fs_loaded = ::access("/proc/driver/nvidia-fs/version", F_OK) == 0;
    (void)cuFileGetParameterBool(CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE, &info.allow_compat_mode);
    (void)cuFileGetParameterBool(CUFILE_PARAM_FORCE_COMPAT_MODE, &info.force_compat_mode);
    CUfileDrvProps_t props{};
    if (cuFileDriverGetProperties(&props).err == CU_FILE_SUCCESS) {
      info.nvfs_major_version = props.nvfs.major_version;
      info.nvfs_minor_version = props.nvfs.minor_version;
    }
    info.mode = info.nvidia_fs_loaded && !info.force_compat_mode ? Mode::GPUDIRECT : Mode::COMPAT;
    if (const char* env = std::getenv("CUFILE_ENV_PATH_JSON")) info.config_json = env;
    return Result<std::unique_ptr<Driver>>(std::move(driver));
  }

  /// Writes a minimal cufile.json that allows compat mode. Errors: DEVICE_ERROR with errno text.
  static Status write_compat_config(const std::string& path) {
    std::FILE* out = std::fopen(path.c_str(), "w");
    if (out == nullptr) return error(StatusCode::DEVICE_ERROR, "writing '{}': {}", path, file::errno_text(errno));
    const int written = std::fputs("{\n  \"properties\": { \"allow_compat_mode\": true }\n}\n", out);
    const int closed = std::fclose(out);
    if (written < 0 || closed != 0)
      return error(StatusCode::DEVICE_ERROR, "writing '{}': {}", path, file::errno_text(errno));
    return Status::success();
  }

  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;
  /// cuFileDriverClose (its error is ignored: nothing can be done about it here).
  ~Driver() {
    if (open_) (void)cuFileDriverClose();
  }

  const DriverInfo& info() const noexcept { return info_; }

 private:
  Driver() = default;
  static Status open_once(const Options& options) {
    const bool nvidia_fs = ::access("/proc/driver/nvidia-fs/version", F_OK) == 0;
    if (options.force_compat_mode || (options.force_compat_without_nvidia_fs && !nvidia_fs))
      TUTTI_RETURN_IF_ERROR(status_of(cuFileSetParameterBool(CUFILE_PARAM_FORCE_COMPAT_MODE, true),
                                      "cuFileSetParameterBool(FORCE_COMPAT_MODE, true)"));
    if (options.allow_compat_mode)
      TUTTI_RETURN_IF_ERROR(status_of(cuFileSetParameterBool(CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE, true),
                                      "cuFileSetParameterBool(ALLOW_COMPAT_MODE, true)"));
    return status_of(cuFileDriverOpen(), "cuFileDriverOpen");
  }
  bool open_ = false;
  DriverInfo info_;
};

/// A file opened read-only with O_DIRECT and registered with cuFile (cuFileHandleRegister).
class File {
 public:
  /// Opens `path`. O_DIRECT is what cuFile expects (GPUDirect needs it; compat mode reads through it
  /// too); `direct = false` opens through the page cache (compat mode only). Errors: NOT_FOUND,
  /// INVALID_ARGUMENT (permissions, not a regular file), UNSUPPORTED (no O_DIRECT on this file system),
  /// DEVICE_ERROR, or cuFileHandleRegister's error.
  static Result<std::unique_ptr<File>> open(const std::string& path, bool direct = true) {
    auto f = std::unique_ptr<File>(new File());
    f->path_ = path;
    f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (f->fd_ < 0) {
      const int e = errno;
      // EINVAL with O_DIRECT: no O_DIRECT on this file system; the rest by the one errno table.
      const StatusCode code = e == EINVAL && direct ? StatusCode::UNSUPPORTED : tutti::status_code_of_errno(e);
      return error(code, "open '{}'{}: {}", path, direct ? " with O_DIRECT" : "", file::errno_text(e));
    }
    struct stat st {};
    if (::fstat(f->fd_, &st) != 0)
      return error(StatusCode::DEVICE_ERROR, "fstat '{}': {}", path, file::errno_text(errno));
    if (!S_ISREG(st.st_mode)) return error(StatusCode::INVALID_ARGUMENT, "'{}' is not a regular file", path);
    f->size_ = static_cast<std::uint64_t>(st.st_size);
    CUfileDescr_t descriptor{};
    descriptor.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    descriptor.handle.fd = f->fd_;
    Status registered =
        status_of(cuFileHandleRegister(&f->handle_, &descriptor), fmt::format("cuFileHandleRegister('{}')", path));
    if (registered.code() == StatusCode::DEVICE_ERROR)  // CU_FILE_HANDLE_NOT_REGISTERED and kin
      registered = registered.with_context(
          "cuFile reads the block device's udev properties (ID_FS_USAGE ...) even in compat mode and refuses the "
          "file when they are missing (a VM or container without a udev database); its cufile.log names the "
          "property");
    TUTTI_RETURN_IF_ERROR(registered);
    f->registered_ = true;
    return Result<std::unique_ptr<File>>(std::move(f));
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  /// cuFileHandleDeregister, then close. Only destroy a File no read() uses.
  ~File() {
    if (registered_) cuFileHandleDeregister(handle_);
    if (fd_ >= 0) ::close(fd_);
  }
  const std::string& path() const noexcept { return path_; }
  std::uint64_t size() const noexcept { return size_; }  ///< Bytes, at open time.
  CUfileHandle_t handle() const noexcept { return handle_; }

 private:
  File() = default;
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
  CUfileHandle_t handle_ = nullptr;
  bool registered_ = false;
};

/// A device memory range registered with cuFile (cuFileBufRegister), the destination of read().
class DeviceBuffer {
 public:
  /// Registers [base, base + bytes) of memory from cudaMalloc. Errors: INVALID_ARGUMENT (null base,
  /// bytes = 0), or cuFileBufRegister's error (CU_FILE_CUDA_MEMORY_TYPE_INVALID for host memory ...).
  static Result<std::unique_ptr<DeviceBuffer>> register_range(void* base, std::uint64_t bytes) {
    if (base == nullptr) return error(StatusCode::INVALID_ARGUMENT, "DeviceBuffer base is null");
    if (bytes == 0) return error(StatusCode::INVALID_ARGUMENT, "DeviceBuffer bytes = 0 must be >= 1");
    auto b = std::unique_ptr<DeviceBuffer>(new DeviceBuffer());
    b->base_ = base;
    b->bytes_ = bytes;
    TUTTI_RETURN_IF_ERROR(status_of(cuFileBufRegister(base, static_cast<size_t>(bytes), 0),
                                    fmt::format("cuFileBufRegister({}, {} bytes)", base, bytes)));
    b->registered_ = true;
    return Result<std::unique_ptr<DeviceBuffer>>(std::move(b));
  }
  /// Describes [base, base + bytes) without registering it: cuFileRead then goes through cuFile's own
  /// bounce buffers (what it does for unregistered memory). For when cuFileBufRegister refuses.
  /// Errors: INVALID_ARGUMENT (null base, bytes = 0).
  static Result<std::unique_ptr<DeviceBuffer>> unregistered(void* base, std::uint64_t bytes) {
    if (base == nullptr) return error(StatusCode::INVALID_ARGUMENT, "DeviceBuffer base is null");
    if (bytes == 0) return error(StatusCode::INVALID_ARGUMENT, "DeviceBuffer bytes = 0 must be >= 1");
    auto b = std::unique_ptr<DeviceBuffer>(new DeviceBuffer());
    b->base_ = base;
    b->bytes_ = bytes;
    return Result<std::unique_ptr<DeviceBuffer>>(std::move(b));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  /// cuFileBufDeregister. Only destroy a DeviceBuffer no read() uses; free the memory after this.
  ~DeviceBuffer() {
    if (registered_) (void)cuFileBufDeregister(base_);
  }
  void* base() const noexcept { return base_; }
  std::uint64_t bytes() const noexcept { return bytes_; }
  bool registered() const noexcept { return registered_; }  ///< cuFileBufRegister succeeded.

 private:
  DeviceBuffer() = default;
  void* base_ = nullptr;
  std::uint64_t bytes_ = 0;
  bool registered_ = false;
};

/// One read: `bytes` bytes at `file_offset` of `file` into the registered buffer at `device_offset`.
struct Range {
  const File* file = nullptr;
  std::uint64_t file_offset = 0;    ///< Bytes from the start of the file.
  std::uint64_t device_offset = 0;  ///< Bytes from DeviceBuffer::base().
  std::uint64_t bytes = 0;          ///< > 0.
};

struct ReadOptions {
  static constexpr std::uint32_t kMaxThreads = 256;
  std::uint32_t threads = 16;                    ///< Reads in flight (worker threads), 1..kMaxThreads.
  std::uint64_t timeout_ns = 60'000'000'000ull;  ///< Budget for the whole call; > 0.
  int device = 0;                                ///< CUDA device made current in each worker.
};

struct ReadReport {
  std::uint64_t bytes = 0;       ///< Bytes that arrived (every range completed: the sum of their bytes).
  std::uint64_t ranges = 0;      ///< Ranges completed.
  std::uint64_t elapsed_ns = 0;  ///< Wall time of the call, from the first read to the last.
  double seconds() const noexcept { return static_cast<double>(elapsed_ns) / 1e9; }
  /// 10^9 bytes per second.
  double gigabytes_per_second() const noexcept {
    return elapsed_ns ? static_cast<double>(bytes) / static_cast<double>(elapsed_ns) : 0.0;
  }
};

/// Checks one range against its file and the buffer. Errors: INVALID_ARGUMENT, OUT_OF_RANGE.
inline Status validate(const DeviceBuffer& buffer, const Range& r, std::size_t index) {
  if (r.file == nullptr) return error(StatusCode::INVALID_ARGUMENT, "ranges[{}].file is null", index);
  if (r.bytes == 0) return error(StatusCode::INVALID_ARGUMENT, "ranges[{}].bytes = 0 must be >= 1", index);
  if (r.bytes > static_cast<std::uint64_t>(SSIZE_MAX))
    return error(StatusCode::INVALID_ARGUMENT, "ranges[{}].bytes = {} exceeds {}", index, r.bytes, SSIZE_MAX);
  if (r.device_offset > buffer.bytes() || r.bytes > buffer.bytes() - r.device_offset)
    return error(StatusCode::OUT_OF_RANGE, "ranges[{}]: device_offset {} + bytes {} exceeds the buffer's {} bytes",
                 index, r.device_offset, r.bytes, buffer.bytes());
  if (r.file_offset > r.file->size() || r.bytes > r.file->size() - r.file_offset)
    return error(StatusCode::OUT_OF_RANGE, "ranges[{}]: file_offset {} + bytes {} exceeds the size {} of '{}'", index,
                 r.file_offset, r.bytes, r.file->size(), r.file->path());
  return Status::success();
}

/// Reads every range into `buffer` with options.threads synchronous cuFileRead calls in flight.
/// Short reads are continued for the remainder; a read of 0 bytes (end of file) is OUT_OF_RANGE.
/// Returns the report when every range arrived; otherwise the first error (ranges not started are
/// skipped once an error happened or the budget ran out: TIMEOUT). A cuFileRead that has started is
/// never abandoned: read() returns only after every worker has returned, so no read lands in
/// memory the caller frees afterwards. Errors: see the file comment; validation errors come before
/// any read; RESOURCE_EXHAUSTED when a reader thread cannot be started (the started ones finish
/// their current range first).
inline Result<ReadReport> read(const DeviceBuffer& buffer, std::span<const Range> ranges, const ReadOptions& options) {
  if (options.threads == 0 || options.threads > ReadOptions::kMaxThreads)
    return error(StatusCode::INVALID_ARGUMENT, "ReadOptions::threads = {} must be in 1..{}", options.threads,
                 ReadOptions::kMaxThreads);
  if (options.timeout_ns == 0) return error(StatusCode::INVALID_ARGUMENT, "ReadOptions::timeout_ns = 0 must be > 0");
  for (std::size_t i = 0; i < ranges.size(); ++i) TUTTI_RETURN_IF_ERROR(validate(buffer, ranges[i], i));
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::nanoseconds(std::min<std::uint64_t>(options.timeout_ns, 1ull << 62));
  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> bytes{0}, done{0};
  std::atomic<bool> stop{false};
  std::mutex failure_mutex;
  Status failure;
  auto fail = [&](Status s) {
    std::scoped_lock lock(failure_mutex);
    if (failure.is_ok()) failure = std::move(s);
    stop.store(true);
  };
  auto worker = [&] {
    if (Status s = cuda_status_of(cudaSetDevice(options.device), "cudaSetDevice"); !s.is_ok())
      return fail(std::move(s));
    while (!stop.load(std::memory_order_relaxed)) {
      const std::size_t i = next.fetch_add(1);
      if (i >= ranges.size()) return;
      if (Clock::now() >= deadline)
        return fail(error(StatusCode::TIMEOUT, "cuFile read: the budget of {} ns ran out with {} of {} ranges done",
                          options.timeout_ns, done.load(), ranges.size()));
      const Range& r = ranges[i];
      std::uint64_t moved = 0;
      while (moved < r.bytes) {
        const ssize_t got =
            cuFileRead(r.file->handle(), buffer.base(), static_cast<size_t>(r.bytes - moved),
                       static_cast<off_t>(r.file_offset + moved), static_cast<off_t>(r.device_offset + moved));
        const int saved_errno = errno;
        auto what = [&] {  // formatted only on failure
          return fmt::format("cuFileRead of {} bytes at offset {} of '{}' into device offset {}", r.bytes - moved,
                             r.file_offset + moved, r.file->path(), r.device_offset + moved);
        };
        if (got < 0) return fail(status_of_io(got, saved_errno, what()));
        if (got == 0) return fail(error(StatusCode::OUT_OF_RANGE, "{}: end of file after {} bytes", what(), moved));
        moved += static_cast<std::uint64_t>(got);
      }
      bytes.fetch_add(moved);
      done.fetch_add(1);
    }
  };
  {
    std::vector<std::jthread> workers;
    const std::size_t n = std::min<std::size_t>(options.threads, std::max<std::size_t>(ranges.size(), 1));
    try {
      workers.reserve(n);
      for (std::size_t t = 0; t < n; ++t) workers.emplace_back(worker);
    } catch (const std::exception& e) {  // std::system_error (no thread) or std::bad_alloc
      // The threads already started stop after their current range; the read fails whole.
      fail(error(StatusCode::RESOURCE_EXHAUSTED, "cuFile read: could not start reader thread {} of {}: {}",
                 workers.size() + 1, n, e.what()));
    }
  }  // joins every worker
  const auto elapsed = Clock::now() - start;
  if (!failure.is_ok()) return failure;
  ReadReport report;
  report.bytes = bytes.load();
  report.ranges = done.load();
  report.elapsed_ns = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count());
  return report;
}

}  // namespace tutti::bench::cufile
