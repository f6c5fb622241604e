// The striped_nvme DataPath: StripedNvmeDataPath, the tutti::DataPath over N nvme::Controllers,
// one per shard of a striped_file::Target (bind/striped_file.hpp). What it is made of:
//  - one local_nvme::Engine per controller (path/local_nvme/engine.hpp): its I/O queue pairs,
//    credits, zombie list and kernel gate, all created by create();
//  - ONE device table: the kernels' views of every controller's queue pairs side by side
//    (controller d's queue q is entry queue_base[d] + q), so ONE AdmitKernel launch per submit and
//    ONE PollKernel launch per progress step cover all N controllers;
//  - the kernels and their per-request work are local_nvme's own (kernels.hpp: admission,
//    splitting at extents and MDTS, PRP tables, retries, timeouts and Abort); so are staging
//    (staging.hpp: stage_request, rejection, completion_of), the batch pool (batch_pool.hpp)
//    and the open shard targets (targets.hpp: make_open_target).
// Submit splits every request at unit boundaries into unit pieces, each a sub-request on its
// shard's controller (bind/striped_file.hpp, place); a FLUSH becomes one NVMe Flush per shard.
// Progress gathers the pieces of each request into its completion: OK when every piece
// completed OK; otherwise the first failing piece's status (in logical order) with context
// naming the shard, confirmed_bytes the bytes confirmed before the first failed piece plus that
// piece's own. A request whose every piece was refused at submit is refused (nothing ran). A
// request with at least one accepted piece is accepted: its pieces refused for lack of queue
// credits (backpressure) are deferred and admitted again by progress, before its poll launch, in
// runs of consecutive pieces (one AdmitKernel launch per run), until
// command_timeout_ns + abort_timeout_ns after the submit; one still refused then, or refused for
// another reason (alignment, memory room, file changed), fails its request with that status.
// Preallocated: the queue pairs and the device table in create, the PRP tables in
// register_memory (one registration per controller), batch slots and fan-out tables in bounded
// pools that grow to the largest batch and are then reused (no allocation per submit).
// Units: bytes; time in ns. Thread-safety: as LocalNvmeDataPath (submit and progress of different
// batches concurrently; open/close/register/unregister from any thread).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <tutti/accel/async_copy.hpp>
#include <tutti/accel/primitives.hpp>
#include <tutti/bind/striped_file.hpp>
#include <tutti/core/concepts.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/leak.hpp>
#include <tutti/core/status.hpp>
#include <tutti/nvme/controller.hpp>
#include <tutti/path/local_nvme.hpp>

namespace tutti::striped_nvme {

/// Most controllers one StripedNvmeDataPath drives (the shards of one target).
inline constexpr std::uint32_t kMaxControllers = striped_file::kMaxShards;
/// Most unit pieces (sub-requests) one submit may split into.
inline constexpr std::size_t kMaxPiecesPerSubmit = std::size_t{1} << 18;

/// An open striped target: one local_nvme open target per shard (shard d on controller d).
struct OpenTarget {
  std::string name;
  std::uint64_t unit_bytes = 0;
  std::uint64_t logical_size = 0;
  std::vector<local_nvme::OpenTarget> shards;
  bool flush_on_close = false;
};

/// A registration: one local_nvme registration (DMA mapping and PRP table) per controller.
struct RegisteredMemory {
  std::vector<local_nvme::RegisteredMemory> per_controller;
};

/// A unit piece as local_nvme's stage_request reads it (the fields of a PathRequest it uses).
struct Piece {
  Direction direction = Direction::READ;
  const local_nvme::RegisteredMemory* memory = nullptr;
  MemoryView memory_view;
  std::uint64_t memory_offset = 0;
  std::uint64_t target_offset = 0;  ///< bytes into the shard file
  std::uint64_t length = 0;
};

/// The host-side fan-out of one batch: which request and controller each piece belongs to, and
/// the gathered completion of each request. Reused through FanoutPool.
/// Pieces are indexed by their batch-slot position ("piece j"), which groups them by controller
/// (see StripedNvmeDataPath::submit); piece_list gives each request's pieces in logical order.
struct Fanout {
  std::vector<std::uint32_t> request_of;   ///< per piece
  std::vector<std::uint32_t> device_of;    ///< per piece
  std::vector<std::uint32_t> first_piece;  ///< per request: piece_list[first_piece[i] .. first_piece[i + 1])
  std::vector<std::uint32_t> piece_list;   ///< the pieces of each request in logical order (slot positions)
  std::vector<std::uint32_t> remaining;    ///< per request: pieces not yet completed
  std::vector<RequestCompletion> piece_done;
  std::vector<Status> refused;         ///< per piece: the rejection of a refused piece (OK if accepted)
  std::vector<std::uint8_t> deferred;  ///< per piece: refused for credits, admitted again by progress
  std::vector<Piece> pieces;
  std::uint64_t deferred_deadline = 0;  ///< deferred pieces still refused then fail (accel::timer_ns)
};

struct FanoutPool {
  std::mutex mutex;
  std::vector<std::unique_ptr<Fanout>> idle;
};

struct FanoutReturn {
  std::shared_ptr<FanoutPool> pool;
  void operator()(Fanout* f) const noexcept {
    if (f == nullptr) return;
    std::scoped_lock lock(pool->mutex);
    try {
      pool->idle.emplace_back(f);
    } catch (const std::bad_alloc&) {
      delete f;
    }
  }
};

/// One submit's in-flight state: the local_nvme batch slot of its pieces and its fan-out.
struct Batch {
  local_nvme::Batch pieces;
  std::unique_ptr<Fanout, FanoutReturn> fanout;
  std::size_t requests = 0;
};

class StripedNvmeDataPath {
 public:
  using Options = local_nvme::Options;
  using target_type = striped_file::Target;
  using open_target = OpenTarget;
  using registered_memory = RegisteredMemory;
  using batch = Batch;

  static constexpr std::string_view name = "striped_nvme";
  /// local_nvme's limits (each piece is a local_nvme request), except that a striped target's
  /// logical size is whole units: no unaligned tail.
  static constexpr Capabilities capabilities = [] {
    Capabilities c = local_nvme::LocalNvmeDataPath::capabilities;
    c.unaligned_tail_at_end_of_target = false;
    return c;
  }();

  /// Creates the queue pairs on every controller (brought up), with the same `options` for each,
  /// the device table over them, and Options::prepared_batches batch slots of the DataPath's own pool,
  /// each with room for Options::prepared_batch_requests PIECES (a request of length L splits into one
  /// piece per stripe unit it touches, at most ceil(L / unit) + 1; a FLUSH into N), so submits of up to
  /// that many pieces allocate no pinned or device memory; a larger submit grows its slot, which in the CUDA
  /// profile waits behind persistent kernels (local_nvme's Options::prepared_batches). Errors:
  /// INVALID_ARGUMENT (no controller, more than kMaxControllers, a null controller), local_nvme::
  /// validate_options' (naming the field), local_nvme::Engine::create's for controller d (with context
  /// "striped_nvme: controller d"; queues already created are deleted), BatchSlot::prepare's for a
  /// prepared slot.
  static Result<StripedNvmeDataPath> create(std::span<nvme::Controller* const> controllers, Options options = {}) {
    if (controllers.empty() || controllers.size() > kMaxControllers)
      return error(StatusCode::INVALID_ARGUMENT, "striped_nvme: {} controllers; expected 1 to {}", controllers.size(),
                   kMaxControllers);
    for (std::size_t d = 0; d < controllers.size(); ++d)
      if (controllers[d] == nullptr)
        return error(StatusCode::INVALID_ARGUMENT, "striped_nvme: controllers[{}] is null", d);
    if (auto checked = local_nvme::validate_options(options, controllers[0]->identity()); !checked)
      return checked.status().with_context("striped_nvme");
    if (options.persistent_poller_warps != 0)
      return error(StatusCode::INVALID_ARGUMENT,
                   "striped_nvme: persistent_poller_warps = {}: the persistent poller serves local_nvme only (0 here)",
                   options.persistent_poller_warps);
    // The engines' own pools would hold slots striped_nvme never takes (its pool below holds pieces).
    Options engine_options = options;
    engine_options.prepared_batches = 0;
    auto state = std::make_unique<State>();
    state->options = options;
    state->pool->limit = options.max_batches_in_flight;
    std::size_t total_queues = 0;
    for (std::size_t d = 0; d < controllers.size(); ++d) {
      auto engine = local_nvme::Engine::create(*controllers[d], engine_options);
      if (!engine) return engine.status().with_context(fmt::format("striped_nvme: controller {}", d));
      state->queue_base.push_back(static_cast<std::uint32_t>(total_queues));
      total_queues += engine.value()->queues.size();
      state->window = std::min(state->window, engine.value()->options.request_window);
      state->engines.push_back(std::move(engine.value()));
    }
    std::vector<local_nvme::DeviceQueue> views;
    try {
      views.reserve(total_queues);
      for (const auto& engine : state->engines)
        views.insert(views.end(), engine->queue_views.begin(), engine->queue_views.end());
    } catch (const std::bad_alloc&) {
      return error(StatusCode::RESOURCE_EXHAUSTED, "striped_nvme: no memory for the device table of {} queue pairs",
                   total_queues);
    }
    auto table = local_nvme::upload_queue_table(views);
    if (!table) return table.status().with_context("striped_nvme: the device table");
    state->device_table = std::move(table.value());
    TUTTI_RETURN_IF_ERROR(local_nvme::prepare_idle_slots(*state->pool, options.prepared_batches,
                                                         options.prepared_batch_requests, state->window, 0,
                                                         options.poll_stream_per_batch, "striped_nvme"));
    return StripedNvmeDataPath(std::move(state));
  }

  StripedNvmeDataPath(StripedNvmeDataPath&&) noexcept = default;
  StripedNvmeDataPath& operator=(StripedNvmeDataPath&&) noexcept = default;

  /// Controllers driven (shards per target).
  std::size_t controller_count() const noexcept { return state_->engines.size(); }
  /// The LBA size of controller d's namespace.
  std::uint32_t lba_size(std::size_t d) const { return state_->engines.at(d)->lba_size; }
  /// Submit and poll launches so far (one each per submit / progress step, whatever N is).
  std::uint64_t launches() const noexcept { return state_->launches.load(); }
  /// NVMe Abort commands sent so far, over all controllers.
  std::uint64_t aborts_sent() const noexcept {
    std::uint64_t n = 0;
    for (const auto& e : state_->engines) n += e->aborts_sent.load();
    return n;
  }
  /// Batch slots allocated by the DataPath's pool: held by live batches plus idle ones kept for reuse
  /// (Options::prepared_batches of them from create on). Thread-safe.
  std::size_t batch_slots_allocated() const { return state_->pool->slots_allocated(); }
  /// Timed-out commands never answered, over all controllers (their memory stays mapped).
  std::size_t zombie_commands() {
    std::size_t n = 0;
    for (auto& e : state_->engines) {
      e->reap_zombies();
      n += e->zombies.size();
    }
    return n;
  }

  /// Opens every shard on its controller (local_nvme::make_open_target: the L2 copy of its
  /// extents, its change signal). Errors: INVALID_ARGUMENT when the payload's shard count is not
  /// the controller count, Target::validate's, and make_open_target's for shard d (with context).
  Result<open_target> open(striped_file::Target&& target, const OpenOptions& options) {
    State& s = *state_;
    if (target.shards.size() != s.engines.size())
      return error(StatusCode::INVALID_ARGUMENT,
                   "striped_nvme: '{}' has {} shards but the DataPath drives {} controllers", target.name,
                   target.shards.size(), s.engines.size());
    TUTTI_RETURN_IF_ERROR(target.validate());
    OpenTarget t;
    t.name = target.name;
    t.unit_bytes = target.unit_bytes;
    t.logical_size = target.logical_size;
    t.flush_on_close = options.flush_on_close;
    OpenOptions shard_options = options;
    shard_options.flush_on_close = false;  // the striped close flushes every shard in one batch
    for (std::size_t d = 0; d < target.shards.size(); ++d) {
      auto shard = local_nvme::make_open_target(std::move(target.shards[d]), shard_options, s.engines[d]->lba_size,
                                                s.engines[d]->target_cache, s.engines[d]->change_words);
      if (!shard) {
        for (auto& opened : t.shards) (void)opened.payload->guard.release();
        return shard.status().with_context(fmt::format("striped_nvme: '{}' shard {}", t.name, d));
      }
      t.shards.push_back(std::move(shard.value()));
    }
    return Result<open_target>(std::move(t));
  }
  /// The logical size in bytes.
  std::uint64_t size_bytes(const open_target& t) const noexcept { return t.logical_size; }

  /// Ends every shard's lease. With flush_on_close, first one NVMe Flush per shard in one batch,
  /// waited for at most command_timeout_ns + abort_timeout_ns + admin_timeout_ns; its failure is
  /// returned (the leases are released either way). Each shard's change guard is released; the
  /// first failure is returned. Only called with no IO in flight on the target.
  Status close(open_target& t) {
    Status result;
    if (t.flush_on_close && !t.shards.empty()) {
      const PathRequest<StripedNvmeDataPath> flush{Direction::FLUSH, nullptr, MemoryView{}, 0, &t, 0, 0};
      Status state;
      batch b = submit(std::span<const PathRequest<StripedNvmeDataPath>>(&flush, 1), std::span<Status>(&state, 1));
      if (!state.is_ok()) {
        local_nvme::detail::assign(result, state.with_context("flush on close"));
      } else {
        RequestCompletion completion;
        const Options& o = state_->options;
        const Status s = progress(b, std::span<RequestCompletion>(&completion, 1),
                                  o.command_timeout_ns + o.abort_timeout_ns + o.admin_timeout_ns);
        if (!s.is_ok()) {
          leak_on_purpose(new batch(std::move(b)));  // still in flight: keep what it references
          local_nvme::detail::assign(
              result, error(StatusCode::TIMEOUT, "flush on close: the NVMe Flushes did not complete in time"));
        } else {
          local_nvme::detail::assign(result, completion.status.with_context("flush on close"));
        }
      }
    }
    for (auto& shard : t.shards) {
      if (shard.payload) {
        const Status released = shard.payload->guard.release();
        if (result.is_ok() && !released.is_ok()) local_nvme::detail::assign(result, released.with_context("close"));
      }
      shard.payload.reset();
      shard.cache_lease.reset();
    }
    t.shards.clear();
    return result;
  }

  /// DMA-maps the region on every controller and prebuilds its PRP lists there
  /// (local_nvme::register_region, once per controller). Errors: register_region's for
  /// controller d (with context); nothing stays mapped on error. Thread-safe.
  Result<registered_memory> register_memory(const MemoryView& view) {
    RegisteredMemory m;
    m.per_controller.reserve(state_->engines.size());
    for (std::size_t d = 0; d < state_->engines.size(); ++d) {
      auto r = local_nvme::register_region(*state_->engines[d]->controller, view);
      if (!r) return r.status().with_context(fmt::format("striped_nvme: controller {}", d));
      m.per_controller.push_back(std::move(r.value()));
    }
    return Result<registered_memory>(std::move(m));
  }

  /// Unmaps the region from every controller. BUSY (every mapping kept) while a timed-out
  /// command that a controller never answered may still transfer into it.
  Status unregister_memory(registered_memory& memory) {
    for (std::size_t d = 0; d < memory.per_controller.size(); ++d) {
      const auto& mapping = memory.per_controller[d].mapping;
      if (!mapping) continue;
      state_->engines[d]->reap_zombies();
      if (const auto z = mapping->zombies.load(); z > 0)
        return error(StatusCode::BUSY,
                     "striped_nvme: {} timed-out command(s) on this region were never answered by controller {}; the "
                     "mapping stays until they complete or the queues are deleted",
                     z, d);
    }
    memory.per_controller.clear();
    return Status::success();
  }

  /// Splits every request into unit pieces and makes ONE launch over all of them (every
  /// controller). States: OK (accepted: at least one piece runs), a piece's rejection when all
  /// of the request's pieces were refused (local_nvme's rejections), RESOURCE_EXHAUSTED when
  /// max_batches_in_flight batches are alive or the submit splits into more than
  /// kMaxPiecesPerSubmit pieces (nothing runs; INVALID_ARGUMENT for a request that alone does), the launch's or the
  /// wait's error (as LocalNvmeDataPath::submit).
  batch submit(std::span<const PathRequest<StripedNvmeDataPath>> requests, std::span<Status> states) {
    const std::size_t n = requests.size();
    batch b;
    b.requests = n;
    if (n == 0) return b;
    State& s = *state_;
    const std::uint32_t devices = static_cast<std::uint32_t>(s.engines.size());
    const auto reject_all = [&](const Status& why) {
      for (std::size_t i = 0; i < n; ++i) local_nvme::detail::assign(states[i], why);
    };
    const auto pieces_of = [&](const auto& p) -> std::size_t {
      if (p.direction == Direction::FLUSH) return devices;
      if (p.length == 0) return 0;
      if (devices == 1) return 1;
      const std::uint64_t unit = p.target->unit_bytes;
      return (p.target_offset + p.length - 1) / unit - p.target_offset / unit + 1;
    };
    std::size_t m = 0;
    for (const auto& p : requests) m += pieces_of(p);
    if (m > kMaxPiecesPerSubmit) {
      // A request that alone splits into more pieces than a submit takes can never run: refuse it
      // for good (INVALID_ARGUMENT), and the others as backpressure, which run when submitted without it.
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t own = pieces_of(requests[i]);
        local_nvme::detail::assign(
            states[i],
            own > kMaxPiecesPerSubmit
                ? error(StatusCode::INVALID_ARGUMENT,
                        "striped_nvme: requests[{}].length = {} at unit {} splits into {} unit pieces; at most {} per "
                        "submit (a shorter request or a larger unit)",
                        i, requests[i].length, requests[i].target->unit_bytes, own, kMaxPiecesPerSubmit)
                : error(StatusCode::RESOURCE_EXHAUSTED,
                        "striped_nvme: the batch splits into {} unit pieces; at most {} per submit (submit fewer or "
                        "shorter requests, or use a larger unit)",
                        m, kMaxPiecesPerSubmit));
      }
      return b;
    }
    auto acquired = local_nvme::acquire_batch(s.pool);
    if (!acquired) {
      reject_all(acquired.status().with_context("striped_nvme"));
      return b;
    }
    b.pieces = std::move(acquired.value());
    auto fanout = acquire_fanout();
    if (!fanout) {
      reject_all(fanout.status());
      b.pieces.slot.reset();
      return b;
    }
    b.fanout = std::move(fanout.value());
    Fanout& f = *b.fanout;
    local_file::poll_changes();
    local_nvme::BatchSlot& slot = *b.pieces.slot;
    try {
      f.request_of.resize(m);
      f.device_of.resize(m);
      f.first_piece.resize(n + 1);
      f.piece_list.resize(m);
      f.remaining.assign(n, 0);
      f.piece_done.assign(m, RequestCompletion{});
      f.refused.assign(m, Status::success());
      f.deferred.assign(m, 0);
      f.pieces.resize(m);
    } catch (const std::bad_alloc&) {
      reject_all(error(StatusCode::RESOURCE_EXHAUSTED, "striped_nvme: no memory for the fan-out of {} pieces", m));
      b.pieces.slot.reset();
      return b;
    }
    if (Status prepared = slot.prepare(m, s.window, 0, s.options.poll_stream_per_batch); !prepared.is_ok()) {
      reject_all(prepared.with_context("striped_nvme"));
      b.pieces.slot.reset();
      return b;
    }
    // Unit pieces, walked in logical order within each request. They take their slot positions
    // grouped by controller (a stable counting sort: pass 1 counts each controller's pieces, pass
    // 2 places them), so the 32 lanes of a kernel warp mostly reach ONE controller and one queue
    // pair, as in local_nvme; interleaved in logical order, a warp's lanes would reach every
    // controller, and warp_submit and warp_reap serialise one group per queue pair they name.
    const auto for_each_piece = [&](auto&& add) {
      for (std::size_t i = 0; i < n; ++i) {
        const auto& p = requests[i];
        if (p.direction == Direction::FLUSH) {
          for (std::uint32_t d = 0; d < devices; ++d)
            add(i, d, Piece{Direction::FLUSH, nullptr, MemoryView{}, 0, 0, 0});
          continue;
        }
        const std::uint64_t unit = p.target->unit_bytes;
        for (std::uint64_t at = p.target_offset, end = p.target_offset + p.length; at < end;) {
          // One controller: the request is contiguous on its shard, one piece.
          const std::uint64_t piece_end = devices == 1 ? end : std::min(end, (at / unit + 1) * unit);
          const striped_file::Placement place = striped_file::place(at, unit, devices);
          add(i, place.shard,
              Piece{p.direction, p.memory ? &p.memory->per_controller[place.shard] : nullptr, p.memory_view,
                    p.memory_offset + (at - p.target_offset), place.shard_offset, piece_end - at});
          at = piece_end;
        }
      }
    };
    std::array<std::uint32_t, kMaxControllers> next_position{};
    for_each_piece([&](std::size_t, std::uint32_t d, const Piece&) { ++next_position[d]; });
    for (std::uint32_t d = 0, position = 0; d < devices; ++d) position += std::exchange(next_position[d], position);
    std::size_t k = 0;  // logical piece number
    for_each_piece([&](std::size_t i, std::uint32_t d, const Piece& piece) {
      const std::uint32_t j = next_position[d]++;
      f.request_of[j] = static_cast<std::uint32_t>(i);
      f.device_of[j] = d;
      f.pieces[j] = piece;
      f.piece_list[k++] = j;
    });
    for (std::size_t i = 0, at = 0; i < n; ++i) {
      f.first_piece[i] = static_cast<std::uint32_t>(at);
      at += pieces_of(requests[i]);
    }
    f.first_piece[n] = static_cast<std::uint32_t>(k);
    auto* device_requests = static_cast<local_nvme::RequestState*>(slot.device_requests.data());
    auto* device_records = static_cast<local_nvme::CommandRecord*>(slot.device_records.data());
    auto* device_reports = static_cast<local_nvme::RequestReport*>(slot.device_reports.data());
    // One queue pair per controller per warp of pieces (round robin over the warps each controller's
    // pieces span, as local_nvme gives a warp of requests one queue pair): the lanes of a warp whose
    // pieces go to one controller share ONE SQ reservation and doorbell write in warp_submit, ONE
    // credit CAS, and one CQ in the poll kernel's reaping. Pieces are grouped by controller, so a warp
    // mostly reaches one. Host profile: a warp is one lane, so this is round robin per piece.
    const std::uint64_t lanes = accel::kKernelWarpLanes;
    std::array<std::uint64_t, kMaxControllers> queue_round{};
    for (std::uint32_t d = 0, start = 0; d < devices; start = next_position[d++]) {
      const std::uint64_t first_warp = start / lanes;
      const std::uint64_t spanned = next_position[d] == start ? 0 : (next_position[d] - 1) / lanes - first_warp + 1;
      // queue_round[d] + (j / lanes - first_warp) for piece j of controller d: its warps in order.
      queue_round[d] = s.engines[d]->next_queue.fetch_add(spanned, std::memory_order_relaxed) - first_warp;
    }
    for (std::size_t j = 0; j < m; ++j) {
      const std::uint32_t d = f.device_of[j];
      local_nvme::Engine& e = *s.engines[d];
      local_nvme::OpenTarget& shard = requests[f.request_of[j]].target->shards[d];
      const auto q = static_cast<std::uint32_t>((queue_round[d] + j / lanes) % e.queues.size());
      local_nvme::stage_request(slot.staged[j], f.pieces[j], e, s.queue_base[d] + q, shard.device_target,
                                device_records + j * s.window, slot.mappings[j]);
      slot.staged[j].max_window = s.window;
      slot.signals[j] = shard.signal.get();
      slot.signals[j]->stage(slot.staged[j].target);
    }
    for (std::size_t i = 0; i < n; ++i) f.remaining[i] = f.first_piece[i + 1] - f.first_piece[i];
    void* stream = s.options.stream.native_handle();
    Gates gates(s);  // no zombie reaping on any controller while this kernel may run
    // With Options::submit_poll_budget_ns the kernel also polls the pieces (as local_nvme's submit).
    const std::uint64_t poll_budget = s.options.submit_poll_budget_ns;
    auto* stop_word = static_cast<std::uint64_t*>(slot.device_poll_stop.data());
    Status launched =
        accel::copy_to_device_async(device_requests, slot.staged.data(), m * sizeof(local_nvme::RequestState), stream);
    const bool copy_enqueued = launched.is_ok();  // waited for below, whatever fails after it
    if (launched.is_ok() && poll_budget != 0)
      local_nvme::detail::assign(launched, accel::copy_to_device_async(stop_word, s.engines[0]->zero_word.data(),
                                                                       sizeof(std::uint64_t), stream));
    if (launched.is_ok())
      local_nvme::detail::assign(
          launched, local_nvme::launch_over(s.options, stream, m,
                                            local_nvme::AdmitKernel{device_requests, s.table(), m, device_reports,
                                                                    stop_word, poll_budget}));
    const bool kernel_enqueued = launched.is_ok();
    if (kernel_enqueued) s.launches.fetch_add(1, std::memory_order_relaxed);
    const std::uint64_t polling_ahead =
        poll_budget != 0 && kernel_enqueued ? s.poll_in_flight.fetch_add(1) + 1 : s.poll_in_flight.load();
    const local_nvme::PollLaunchCount counted{s.poll_in_flight, poll_budget != 0 && kernel_enqueued};
    if (launched.is_ok())
      local_nvme::detail::assign(launched,
                                 accel::copy_from_device_async(slot.reports.data(), device_reports,
                                                               m * sizeof(local_nvme::RequestReport), stream));
    if (copy_enqueued) {
      const Status waited = accel::synchronize(stream, local_nvme::kernel_wait_bound_ns(s.options, polling_ahead));
      if (!waited.is_ok()) {
        reject_all(waited.with_context("striped_nvme: submit kernel"));
        abandon(slot);
        return b;
      }
    }
    if (!launched.is_ok()) {
      reject_all(launched.with_context("striped_nvme: submit"));
      if (kernel_enqueued) abandon(slot);
      b.pieces.slot.reset();
      return b;
    }
    gates.unlock();
    f.deferred_deadline = accel::deadline_after(s.options.command_timeout_ns + s.options.abort_timeout_ns);
    bool any_accepted = false;
    for (std::size_t i = 0; i < n; ++i) {
      bool accepted = false;
      Status first_refusal;
      for (std::uint32_t k = f.first_piece[i]; k < f.first_piece[i + 1]; ++k) {
        const std::uint32_t j = f.piece_list[k];
        const local_nvme::RequestReport& report = slot.reports[j];
        if (report.accepted) {
          accepted = true;
          continue;
        }
        local_nvme::detail::assign(f.refused[j], refusal(slot, f, j));
        if (first_refusal.is_ok()) local_nvme::detail::assign(first_refusal, f.refused[j]);
      }
      if (accepted) {
        // Pieces refused for credits wait for progress; any other refusal fails the request.
        for (std::uint32_t k = f.first_piece[i]; k < f.first_piece[i + 1]; ++k) {
          const std::uint32_t j = f.piece_list[k];
          if (slot.reports[j].accepted) continue;
          if (slot.reports[j].outcome == local_nvme::RequestOutcome::rejected_backpressure) {
            f.deferred[j] = 1;
            local_nvme::detail::assign(f.refused[j], Status::success());
          } else {
            slot.reported[j] = 1;
            --f.remaining[i];
          }
        }
      } else {
        for (std::uint32_t k = f.first_piece[i]; k < f.first_piece[i + 1]; ++k) slot.reported[f.piece_list[k]] = 1;
        f.remaining[i] = 0;
      }
      local_nvme::detail::assign(states[i], accepted ? Status::success() : first_refusal);
      any_accepted = any_accepted || accepted;
    }
    if (!any_accepted) b.pieces.slot.reset();
    return b;
  }

  /// Polls the batch for up to timeout_ns: ONE poll launch per step over every piece of every
  /// controller, Aborts and zombie hand-off between steps (as LocalNvmeDataPath::progress).
  /// completions[i] is filled once every piece of request i completed. OK when every accepted
  /// request completed, NOT_READY when the budget ran out first; a failed kernel wait or copy
  /// abandons the batch (DEVICE_ERROR on every later progress). until = ProgressUntil::SOME: returns
  /// after the first step that completed a request (all its pieces; NOT_READY unless it was the last),
  /// and each poll kernel stops once one of its pieces completes (PollKernel::stop_at_first_done).
  Status progress(batch& b, std::span<RequestCompletion> completions, std::uint64_t timeout_ns,
                  ProgressUntil until = ProgressUntil::ALL) {
    if (!b.pieces.slot) return Status::success();
    local_nvme::BatchSlot& slot = *b.pieces.slot;
    if (slot.kernel_may_run)
      return error(
          StatusCode::DEVICE_ERROR,
          "striped_nvme: this batch was abandoned after a failed kernel wait; its requests' outcome is unknown");
    State& s = *state_;
    Fanout& f = *b.fanout;
    const std::uint64_t deadline = accel::deadline_after(timeout_ns);
    const std::size_t m = slot.size;
    accel::Backoff backoff;
    raise_changed_targets(slot);
    const bool some = until == ProgressUntil::SOME;
    bool report_waiting = some && slot.has_unreported_done();  // a one-pass launch brings it back
    // Pieces the submit kernel polled to the end need no launch, unless deferred pieces wait.
    bool launch = !slot.reports_settled();
    for (std::size_t j = 0; j < m && !launch; ++j) launch = f.deferred[j] != 0 && !slot.reported[j];
    for (;;) {
      const std::uint64_t now = accel::timer_ns();
      const std::uint64_t budget =
          report_waiting ? 0 : std::min(s.options.poll_kernel_budget_ns, deadline > now ? deadline - now : 0);
      report_waiting = false;
      if (launch) {
        Gates gates(s);
        // Admissions enqueued before a failure (theirs or the poll step's) may still run: the slot
        // is then abandoned to them, never reused with work of its own still queued.
        bool admitted = false;
        if (Status readmitted = admit_deferred(slot, f, &admitted); !readmitted.is_ok()) {
          if (admitted) abandon(slot);
          return readmitted;
        }
        bool kernel_may_run = false;
        const Status stepped = local_nvme::poll_step(s.options, slot, s.table(), s.engines[0]->zero_word.data(),
                                                     s.launches, s.poll_in_flight, budget, some, &kernel_may_run);
        if (kernel_may_run || (admitted && !stepped.is_ok())) abandon(slot);
        TUTTI_RETURN_IF_ERROR(stepped.with_context("striped_nvme: poll kernel"));
      }
      bool all_done = true;
      bool any_new = false;
      bool request_done = false;  // a request of the caller's span completed in this step (all its pieces)
      raise_changed_targets(slot);
      const bool deferral_over = accel::timer_ns() >= f.deferred_deadline;
      for (std::size_t j = 0; j < m; ++j) {
        const local_nvme::RequestReport& report = slot.reports[j];
        if (slot.reported[j]) continue;
        if (f.deferred[j] != 0) {
          if (report.accepted) {
            f.deferred[j] = 0;  // admitted by this step's AdmitKernel: in flight now
          } else if (report.outcome != local_nvme::RequestOutcome::rejected_backpressure || deferral_over) {
            f.deferred[j] = 0;
            local_nvme::detail::assign(f.refused[j], refusal(slot, f, j));
            slot.reported[j] = 1;
            const std::uint32_t i = f.request_of[j];
            if (--f.remaining[i] == 0) {
              completions[i] = gather(f, i);
              request_done = true;
            }
            continue;
          } else {
            all_done = false;
            continue;
          }
        }
        if (!report.accepted) continue;
        const std::uint32_t d = f.device_of[j];
        local_nvme::Engine& e = *s.engines[d];
        if (report.needs_host != 0) {
          TUTTI_RETURN_IF_ERROR(copy_records_back(slot, j));
          const std::uint32_t queue_index = slot.staged[j].queue_index - s.queue_base[d];
          e.send_aborts(queue_index, slot.records_copy);
          e.zombies.hand_off(queue_index, slot.records_copy, slot.mappings[j]);
        }
        if (!report.done) {
          all_done = false;
          continue;
        }
        f.piece_done[j] = local_nvme::completion_of(e, localized(slot.staged[j], d), report, j, *slot.signals[j]);
        e.commands_retried.fetch_add(report.retries, std::memory_order_relaxed);
        slot.reported[j] = 1;
        any_new = true;
        const std::uint32_t i = f.request_of[j];
        if (--f.remaining[i] == 0) {
          completions[i] = gather(f, i);
          request_done = true;
        }
      }
      for (auto& e : s.engines) e->reap_zombies();
      if (all_done) return Status::success();
      launch = true;
      if ((some && request_done) || accel::timer_ns() >= deadline)
        return Status(StatusCode::NOT_READY, "striped_nvme: batch still in flight");
      if (any_new || budget != 0) {
        backoff.reset();
      } else {
        backoff.pause();
      }
    }
  }

 private:
  struct State {
    Options options;
    std::vector<std::unique_ptr<local_nvme::Engine>> engines;  ///< controller d's queues, zombies, gate
    std::vector<std::uint32_t> queue_base;                     ///< controller d's first entry in device_table
    accel::DeviceBuffer device_table;  ///< every controller's queues (DeviceQueue), in device memory
    const local_nvme::DeviceQueue* table() const noexcept {
      return static_cast<const local_nvme::DeviceQueue*>(device_table.data());
    }
    std::uint32_t window = local_nvme::kMaxWindow;  ///< the smallest engine window (records per piece)
    std::shared_ptr<local_nvme::BatchPool> pool = std::make_shared<local_nvme::BatchPool>();
    std::shared_ptr<FanoutPool> fanouts = std::make_shared<FanoutPool>();
    std::atomic<std::uint64_t> poll_in_flight{0};
    std::atomic<std::uint64_t> launches{0};
    ~State() { device_table = {}; }  // before the engines delete their queues
  };

  /// Shared hold of every controller's kernel gate (in controller order), for one launch and wait.
  /// A fixed array, not a vector: submit and every progress step take one, and neither allocates.
  class Gates {
   public:
    explicit Gates(State& s) : count_(s.engines.size()) {
      for (std::size_t d = 0; d < count_; ++d)
        locks_[d] = std::shared_lock<std::shared_mutex>(s.engines[d]->kernel_gate);
    }
    void unlock() {
      for (std::size_t d = 0; d < count_; ++d) locks_[d] = {};
    }

   private:
    std::size_t count_;
    std::array<std::shared_lock<std::shared_mutex>, kMaxControllers> locks_;
  };

  explicit StripedNvmeDataPath(std::unique_ptr<State> state) : state_(std::move(state)) {}

  Result<std::unique_ptr<Fanout, FanoutReturn>> acquire_fanout() {
    FanoutPool& pool = *state_->fanouts;
    Fanout* f = nullptr;
    {
      std::scoped_lock lock(pool.mutex);
      if (!pool.idle.empty()) {
        f = pool.idle.back().release();
        pool.idle.pop_back();
      }
    }
    if (f == nullptr) f = new (std::nothrow) Fanout();
    if (f == nullptr) return error(StatusCode::RESOURCE_EXHAUSTED, "striped_nvme: no memory for a batch's fan-out");
    return std::unique_ptr<Fanout, FanoutReturn>(f, FanoutReturn{state_->fanouts});
  }

  /// The rejection of piece j as the caller sees it (local_nvme's message, naming the shard).
  Status refusal(const local_nvme::BatchSlot& slot, const Fanout& f, std::size_t j) const {
    const std::uint32_t d = f.device_of[j];
    return local_nvme::rejection(*state_->engines[d], localized(slot.staged[j], d), slot.reports[j], f.pieces[j],
                                 *slot.signals[j])
        .with_context(fmt::format("striped_nvme: controller {}", d));
  }

  /// Admits the deferred pieces again: their staged state copied back over what the kernels left
  /// and one AdmitKernel launch per run of consecutive deferred pieces (enqueued on the slot's
  /// polling stream before the poll launch, so ordered before it; the poll's copy of the reports
  /// brings their outcome back). `*queued` becomes true once anything was enqueued: after that a
  /// failure leaves work on the stream, and the caller must abandon the slot.
  Status admit_deferred(local_nvme::BatchSlot& slot, const Fanout& f, bool* queued) {
    State& s = *state_;
    void* stream = slot.polling_stream(s.options.stream);
    auto* device_requests = static_cast<local_nvme::RequestState*>(slot.device_requests.data());
    auto* device_reports = static_cast<local_nvme::RequestReport*>(slot.device_reports.data());
    for (std::size_t j = 0; j < slot.size;) {
      if (f.deferred[j] == 0 || slot.reported[j]) {
        ++j;
        continue;
      }
      std::size_t end = j + 1;
      while (end < slot.size && f.deferred[end] != 0 && !slot.reported[end]) ++end;
      TUTTI_RETURN_IF_ERROR(accel::copy_to_device_async(device_requests + j, slot.staged.data() + j,
                                                        (end - j) * sizeof(local_nvme::RequestState), stream)
                                .with_context("striped_nvme: deferred pieces"));
      *queued = true;
      TUTTI_RETURN_IF_ERROR(local_nvme::launch_over(
          s.options, stream, end - j,
          local_nvme::AdmitKernel{device_requests + j, s.table(), end - j, device_reports + j}));
      s.launches.fetch_add(1, std::memory_order_relaxed);
      j = end;
    }
    return Status::success();
  }

  /// A piece's staged state with its queue index local to its controller (for staging.hpp's
  /// messages, which name the controller's I/O queue).
  local_nvme::RequestState localized(const local_nvme::RequestState& r, std::uint32_t d) const {
    local_nvme::RequestState copy = r;
    copy.queue_index -= state_->queue_base[d];
    return copy;
  }

  /// The completion of request i from its pieces' (every piece done or refused).
  static RequestCompletion gather(const Fanout& f, std::uint32_t i) {
    RequestCompletion c;
    c.request_index = i;
    c.done = true;
    bool failed = false;
    for (std::uint32_t k = f.first_piece[i]; k < f.first_piece[i + 1]; ++k) {
      const std::uint32_t j = f.piece_list[k];
      const RequestCompletion& p = f.piece_done[j];
      c.commands += p.commands;
      c.retries += p.retries;
      if (failed) continue;
      if (!f.refused[j].is_ok()) {
        local_nvme::detail::assign(c.status, f.refused[j]);
        failed = true;
        continue;
      }
      c.confirmed_bytes += p.confirmed_bytes;
      if (!p.status.is_ok()) {
        local_nvme::detail::assign(c.status,
                                   p.status.with_context(fmt::format("striped_nvme: controller {}", f.device_of[j])));
        c.device_status = p.device_status;
        failed = true;
      }
    }
    return c;
  }

  void abandon(local_nvme::BatchSlot& slot) {
    slot.kernel_may_run = true;
    for (auto& e : state_->engines) e->kernel_abandoned.store(true);
  }

  static void raise_changed_targets(local_nvme::BatchSlot& slot) {
    local_file::poll_changes();
    for (std::size_t i = 0; i < slot.size; ++i)
      if (slot.reported[i] == 0 && slot.signals[i] != nullptr) (void)slot.signals[i]->raise_if_changed();
  }

  Status copy_records_back(local_nvme::BatchSlot& slot, std::size_t j) {
    State& s = *state_;
    const auto* device_records = static_cast<const local_nvme::CommandRecord*>(slot.device_records.data());
    void* stream = slot.polling_stream(s.options.stream);
    const Status copied = accel::copy_from_device_async(slot.records_copy.data(), device_records + j * s.window,
                                                        s.window * sizeof(local_nvme::CommandRecord), stream);
    const Status waited =
        copied.is_ok()
            ? accel::synchronize(stream, local_nvme::kernel_wait_bound_ns(s.options, s.poll_in_flight.load()))
            : copied;
    if (!waited.is_ok()) {
      abandon(slot);
      return waited.with_context("striped_nvme: command records");
    }
    return Status::success();
  }

  std::unique_ptr<State> state_;
};

static_assert(tutti::DataPath<StripedNvmeDataPath>);

}  // namespace tutti::striped_nvme
