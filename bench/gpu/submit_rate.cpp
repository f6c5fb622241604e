// tutti-bench-gpu-submit: how many NVMe commands per second the PRODUCT's path puts through when
// the controller costs nothing, and what the DataPath adds on top of the bare queue protocol.
//
// Controller: NullNvmeController (null_nvme_controller.hpp): the null controller of
// tests/support/null_controller.hpp behind nvme::Controller, its queues in agent memory (GPU
// memory, serviced by a persistent kernel with one warp per queue, in the cuda profile; host
// memory, serviced by host threads, in the host profile). No data moves.
//
// Rows, one run, same controller, same queue count and depth:
//   runtime  the local_nvme DataPath through the public runtime API:
//            StorageRuntime<Backend<NullNamespaceResolver, LocalNvmeDataPath>>; each of --submitters
//            host threads runs batches of B 4 KiB READ requests closed loop: runtime.submit (the
//            DataPath's staging copy, AdmitKernel, report copy, one wait) then runtime.wait (PollKernel
//            launches until done) then release. Every IoResult is checked: OK, B requests, B x 4096
//            confirmed bytes, B commands, no retries. Figures: commands/s, and per-batch latency
//            (submit to wait's return) p50 / p99 / max.
//   raw      the warp submission protocol alone (nvme/warp_queue.hpp through
//            tests/support/raw_queue_driver.hpp): GPU warps (one command per lane, 32 per warp) or
//            host threads (32 per thread), closed loop, each waiting for its round. Queue state in
//            agent memory; in the cuda profile a second row puts it in mapped host memory, where
//            the DataPath keeps it (so the placement's share of the gap shows). Figures: commands/s,
//            per-round latency p50 / p99 / max, SQ doorbell writes per command.
// The summary line gives best runtime / best raw: the DataPath's own overhead as a ratio.
//
// Usage: tutti-bench-gpu-submit [--help] [--commands N] [--repeat R] [--depth D] [--queues Q]
//   [--batch-sizes B,...] [--submitters T] [--shapes W:P,...] [--raw-threads T,...]
//   [--stop-relay 0|1] [--stop-poll-ns NS] [--json FILE]
// Exits 77 when the cuda profile finds no CUDA device; 1 when any row had errors.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <tutti/accel/memory.hpp>
#include <tutti/accel/stream.hpp>
#include <tutti/core/runtime.hpp>
#include <tutti/nvme/queue.hpp>
#include <tutti/path/local_nvme.hpp>

#include "bench_options.hpp"
#include "null_agent.hpp"
#include "null_nvme_controller.hpp"

namespace {

using namespace tutti;
using tutti::bench::gpu::NullNamespaceResolver;
using tutti::bench::gpu::NullNvmeController;
using tutti::test::AgentBuffer;
using Options = tutti::bench::gpu::SubmitRateOptions;
using NullBackend = Backend<NullNamespaceResolver, local_nvme::LocalNvmeDataPath>;
using NullRuntime = StorageRuntime<NullBackend>;

constexpr std::uint64_t kSecond = 1'000'000'000;

struct Row {
  std::string path;          ///< "runtime", "raw", "raw (state in mapped host memory)"
  std::uint32_t agents = 0;  ///< submitter threads (runtime), warps or threads (raw)
  std::uint32_t batch = 0;   ///< requests per submit (runtime), commands per round per agent (raw)
  std::uint32_t queues = 0;
  std::uint64_t commands = 0;  ///< completed and checked
  double seconds = 0;
  double commands_per_second = 0;
  double p50_us = 0, p99_us = 0, max_us = 0;  ///< per batch (runtime) or per round (raw)
  double doorbells_per_command = 0;
  std::uint64_t errors = 0;
  std::string first_error;
};

/// p-th percentile (0..1) of `ns`, in microseconds.
double percentile_us(std::vector<std::uint64_t> ns, double p) {
  if (ns.empty()) return 0;
  std::sort(ns.begin(), ns.end());
  const std::size_t i = std::min(ns.size() - 1, static_cast<std::size_t>(p * static_cast<double>(ns.size())));
  return static_cast<double>(ns[i]) / 1e3;
}

void fill_latency(Row& row, const std::vector<std::uint64_t>& ns) {
  row.p50_us = percentile_us(ns, 0.50);
  row.p99_us = percentile_us(ns, 0.99);
  row.max_us = ns.empty() ? 0 : static_cast<double>(*std::max_element(ns.begin(), ns.end())) / 1e3;
}

void note_error(Row& row, const std::string& what) {
  if (row.errors++ == 0) row.first_error = what;
}

/// Sum of CQEs the null controller posted on queues `qids` (to check nothing was counted twice).
std::uint64_t controller_completions(const NullNvmeController& controller, const std::vector<std::uint16_t>& qids) {
  std::uint64_t posted = 0;
  for (std::uint16_t qid : qids) {
    test::NullControllerState state{};
    const test::NullControllerQueue view = controller.controller_view(qid);
    if (view.state != nullptr && accel::copy_from_device(&state, view.state, sizeof(state)).is_ok())
      posted += state.cq_tail;
  }
  return posted;
}

// ----- runtime rows ------------------------------------------------------------------------------

Row run_runtime(const Options& o, std::uint32_t batch, void* stream) {
  Row best;
  best.path = "runtime";
  best.agents = o.submitters;
  best.batch = batch;
  best.queues = o.queues;
  NullNvmeController controller;
  if (Status s = controller.bring_up({}); !s.is_ok()) {
    note_error(best, s.to_string());
    return best;
  }
  local_nvme::Options datapath;
  datapath.queue_pairs = o.queues;
  datapath.queue_depth = o.depth;
  datapath.stream = accel::StreamRef::from_native_handle(stream);
  datapath.max_batches_in_flight = std::max<std::uint32_t>(4, 2 * o.submitters);
  // Every slot made now, before the null service's persistent kernel starts (Options::prepared_batches).
  datapath.prepared_batches = datapath.max_batches_in_flight;
  datapath.prepared_batch_requests = batch;
  auto path = local_nvme::LocalNvmeDataPath::create(controller, datapath);
  if (!path) {
    note_error(best, path.status().to_string());
    return best;
  }
  std::vector<std::uint16_t> qids;
  for (std::uint16_t qid = 1; qid <= o.queues; ++qid) qids.push_back(qid);
  NullRuntime runtime(NullBackend{NullNamespaceResolver{}, std::move(path.value())});
  const std::uint64_t target_bytes = std::uint64_t{batch} * 4096;
  auto target = runtime.open(fmt::format("null://namespace?bytes={}", target_bytes));
  if (!target) {
    note_error(best, target.status().to_string());
    return best;
  }
  // One host buffer per submitter (no data moves: the null controller ignores PRPs).
  std::vector<void*> buffers(o.submitters, nullptr);
  std::vector<MemoryHandle> memory(o.submitters);
  for (std::uint32_t t = 0; t < o.submitters; ++t) {
    buffers[t] = std::aligned_alloc(4096, target_bytes);
    auto m = runtime.register_memory({buffers[t], target_bytes, MemoryKind::HOST, -1});
    if (!m) {
      note_error(best, m.status().to_string());
      for (void* b : buffers) std::free(b);
      return best;
    }
    memory[t] = *m;
  }
  std::vector<std::vector<IoRequest>> requests(o.submitters);
  for (std::uint32_t t = 0; t < o.submitters; ++t)
    for (std::uint32_t i = 0; i < batch; ++i)
      requests[t].push_back(
          IoRequest{Direction::READ, memory[t], std::uint64_t{i} * 4096, *target, std::uint64_t{i} * 4096, 4096});
  const std::uint64_t batches_per_submitter =
      std::max<std::uint64_t>(4, o.commands / (std::uint64_t{batch} * o.submitters));

  auto service = bench::gpu::start_null_service(
      [&] {
        std::vector<test::NullControllerQueue> views;
        for (std::uint16_t qid : qids) views.push_back(controller.controller_view(qid));
        return views;
      }(),
      bench::gpu::NullServiceSettings{o.stop_relay != 0, o.stop_poll_ns, 1});
  if (!service) {
    note_error(best, service.status().to_string());
  } else {
    std::uint64_t counted = 0;                       // commands checked over all runs, for the controller cross-check
    for (std::uint32_t r = 0; r <= o.repeat; ++r) {  // run 0 warms up (the batch pool grows) and is not reported
      Row row = best;
      row.commands = 0;
      row.errors = 0;
      row.first_error.clear();
      const std::uint64_t batches = r == 0 ? 2 : batches_per_submitter;
      std::vector<std::vector<std::uint64_t>> latencies(o.submitters);
      std::vector<Row> partial(o.submitters, row);
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::thread> threads;
      for (std::uint32_t t = 0; t < o.submitters; ++t)
        threads.emplace_back([&, t] {
          for (std::uint64_t b = 0; b < batches; ++b) {
            const auto began = std::chrono::steady_clock::now();
            auto outcome = runtime.submit(requests[t]);
            bool accepted = true;
            for (const Status& s : outcome.initial_states)
              if (!s.is_ok()) {
                note_error(partial[t], s.to_string());
                accepted = false;
                break;
              }
            auto result = runtime.wait(outcome.io, 60 * kSecond);
            const auto ended = std::chrono::steady_clock::now();
            if (!result) {
              note_error(partial[t], result.status().to_string());
            } else if (accepted) {
              const IoResult& io = result.value();
              if (!io.status.is_ok() || io.requests != batch || io.confirmed_bytes != std::uint64_t{batch} * 4096 ||
                  io.commands != batch || io.retries() != 0)
                note_error(partial[t], fmt::format("IoResult: {}, {} requests, {} bytes, {} commands, {} retries",
                                                   io.status.to_string(), io.requests, io.confirmed_bytes, io.commands,
                                                   io.retries()));
              else
                partial[t].commands += batch;
            }
            (void)runtime.release(outcome.io);
            latencies[t].push_back(static_cast<std::uint64_t>(
                std::chrono::duration_cast<std::chrono::nanoseconds>(ended - began).count()));
          }
        });
      for (auto& thread : threads) thread.join();
      row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::vector<std::uint64_t> all;
      for (std::uint32_t t = 0; t < o.submitters; ++t) {
        row.commands += partial[t].commands;
        if (partial[t].errors != 0) {
          if (row.errors == 0) row.first_error = partial[t].first_error;
          row.errors += partial[t].errors;
        }
        all.insert(all.end(), latencies[t].begin(), latencies[t].end());
      }
      counted += row.commands;
      if (r == 0) {
        if (row.errors != 0) best = row;
        continue;
      }
      row.commands_per_second = static_cast<double>(row.commands) / row.seconds;
      fill_latency(row, all);
      if (row.errors != 0 || best.errors != 0) {
        if (best.errors == 0) best = row;
      } else if (row.commands_per_second > best.commands_per_second) {
        best = row;
      }
    }
    std::uint64_t doorbells = 0;
    for (std::uint32_t q = 0; q < o.queues; ++q) doorbells += runtime.datapath().queue_statistics(q).doorbell_writes;
    const std::uint32_t exits = service.value()->stop();
    if (exits != 0) note_error(best, fmt::format("{} null controller agents ran out of budget", exits));
    const std::uint64_t posted = controller_completions(controller, qids);
    if (posted != counted)
      note_error(best,
                 fmt::format("the null controller posted {} completions for {} commands counted", posted, counted));
    best.doorbells_per_command = counted == 0 ? 0 : static_cast<double>(doorbells) / static_cast<double>(counted);
  }
  for (std::uint32_t t = 0; t < o.submitters; ++t) (void)runtime.unregister_memory(memory[t]);
  (void)runtime.close(*target);
  (void)runtime.shutdown(10 * kSecond);
  for (void* b : buffers) std::free(b);
  return best;
}

// ----- raw rows ----------------------------------------------------------------------------------

/// The submitters' state of `count` queue pairs (nvme::QueuePair views, their QueuePairState,
/// ready words, command slots and CID bitmaps) in agent memory, or in mapped host memory.
struct RawQueues {
  std::vector<nvme::QueuePair> views;
  std::vector<AgentBuffer> agent;
  std::vector<accel::MappedHostBuffer> mapped;
  AgentBuffer device_views;

  Status build(const std::vector<nvme::QueuePairInfo>& infos, bool in_mapped_host) {
    for (const nvme::QueuePairInfo& info : infos) {
      const std::uint32_t depth = info.depth, words = (depth + 31) / 32;
      const std::size_t bytes = sizeof(nvme::QueuePairState) + depth * sizeof(std::uint64_t) +
                                depth * sizeof(nvme::CommandSlot) + words * sizeof(std::uint32_t);
      char* base = nullptr;
      if (in_mapped_host) {
        auto b = accel::MappedHostBuffer::allocate(bytes);
        if (!b) return b.status();
        base = static_cast<char*>(b->data());
        mapped.push_back(std::move(*b));
      } else {
        auto b = AgentBuffer::allocate(bytes);
        if (!b) return b.status();
        base = b->as<char>();
        agent.push_back(std::move(*b));
      }
      nvme::QueuePair v;
      v.sq = info.submission_queue;
      v.cq = info.completion_queue;
      v.sq_tail_doorbell = info.submission_queue_tail_doorbell;
      v.cq_head_doorbell = info.completion_queue_head_doorbell;
      v.controller_status = info.controller_status;
      v.depth = depth;
      v.qid = info.qid;
      v.cid_capacity = depth;
      v.cid_index_bits = nvme::cid_index_bits_for(depth);
      v.state = reinterpret_cast<nvme::QueuePairState*>(base);
      v.sq_ready = reinterpret_cast<std::uint64_t*>(base + sizeof(nvme::QueuePairState));
      v.slots =
          reinterpret_cast<nvme::CommandSlot*>(base + sizeof(nvme::QueuePairState) + depth * sizeof(std::uint64_t));
      v.cid_bitmap =
          reinterpret_cast<std::uint32_t*>(reinterpret_cast<char*>(v.slots) + depth * sizeof(nvme::CommandSlot));
      // Memory starts zeroed: an empty queue, except the first Phase Tag expected (1) and the
      // bitmap bits past the capacity.
      nvme::QueuePairState state{};
      state.cq_phase = 1;
      TUTTI_RETURN_IF_ERROR(accel::copy_to_device(v.state, &state, sizeof(state)));
      std::vector<std::uint32_t> bitmap(words, 0);
      for (std::uint32_t bit = depth; bit < words * 32; ++bit) bitmap[bit / 32] |= 1u << (bit % 32);
      TUTTI_RETURN_IF_ERROR(accel::copy_to_device(v.cid_bitmap, bitmap.data(), words * sizeof(std::uint32_t)));
      views.push_back(v);
    }
    auto d = AgentBuffer::allocate(views.size() * sizeof(nvme::QueuePair));
    if (!d) return d.status();
    device_views = std::move(*d);
    return accel::copy_to_device(device_views.as<void>(), views.data(), views.size() * sizeof(nvme::QueuePair));
  }
  std::uint64_t doorbell_writes() const {
    std::uint64_t sum = 0;
    for (const nvme::QueuePair& v : views) {
      nvme::QueuePairState s{};
      if (accel::copy_from_device(&s, v.state, sizeof(s)).is_ok()) sum += s.doorbell_writes;
    }
    return sum;
  }
};

Row run_raw(const Options& o, std::uint32_t agents, std::uint32_t per_block, bool state_in_mapped_host) {
  Row best;
  best.path = state_in_mapped_host ? "raw (state in mapped host memory)" : "raw";
  best.agents = agents;
  const std::uint32_t per_lane = bench::gpu::raw_commands_per_lane();
  best.batch = per_lane * (per_lane == 1 ? 32u : 1u);
  best.queues = std::min(o.queues, agents);
  NullNvmeController controller;
  (void)controller.bring_up({});
  std::vector<nvme::QueuePairInfo> infos;
  std::vector<std::uint16_t> qids;
  for (std::uint32_t q = 0; q < best.queues; ++q) {
    auto info = controller.create_io_queue_pair(o.depth);
    if (!info) {
      note_error(best, info.status().to_string());
      return best;
    }
    infos.push_back(*info);
    qids.push_back(info->qid);
  }
  RawQueues queues;
  if (Status s = queues.build(infos, state_in_mapped_host); !s.is_ok()) {
    note_error(best, s.to_string());
    return best;
  }
  const std::uint32_t lanes = per_lane == 1 ? 32u : 1u;
  std::uint64_t per_agent = std::max<std::uint64_t>(std::uint64_t{lanes} * per_lane * 32, o.commands / agents);
  per_agent = per_agent / (std::uint64_t{lanes} * per_lane) * lanes * per_lane;
  std::vector<test::NullControllerQueue> views;
  for (std::uint16_t qid : qids) views.push_back(controller.controller_view(qid));
  // Everything in agent memory is allocated before the persistent service starts: freeing device
  // memory (cudaFree) waits for every kernel, the service included (docs/gpu.md, "Pitfall").
  auto records = AgentBuffer::allocate(per_agent * agents * sizeof(test::RawCommandRecord));
  auto totals = AgentBuffer::allocate(2 * sizeof(unsigned long long));
  if (!records || !totals) {
    note_error(best, "no memory for the raw rows' records");
    return best;
  }
  auto service =
      bench::gpu::start_null_service(views, bench::gpu::NullServiceSettings{o.stop_relay != 0, o.stop_poll_ns, 1});
  if (!service) {
    note_error(best, service.status().to_string());
    return best;
  }
  std::uint64_t counted = 0;
  for (std::uint32_t r = 0; r <= o.repeat; ++r) {
    const std::uint64_t commands_per_agent = r == 0 ? std::uint64_t{lanes} * per_lane * 4 : per_agent;
    const std::uint64_t commands = commands_per_agent * agents;
    std::vector<test::RawCommandRecord> initial(commands, test::RawCommandRecord{test::kNotRun, 0, 0, 0, 0, 0, 0});
    const unsigned long long zero[2] = {0, 0};
    (void)accel::copy_to_device(records->as<void>(), initial.data(), initial.size() * sizeof(initial[0]));
    (void)accel::copy_to_device(totals->as<void>(), zero, sizeof(zero));
    test::RawDriverArgs args;
    args.queues = queues.device_views.as<const nvme::QueuePair>();
    args.queue_count = best.queues;
    args.commands_per_warp = static_cast<std::uint32_t>(commands_per_agent);
    args.per_lane = per_lane;
    args.records = records->as<test::RawCommandRecord>();
    args.completed = totals->as<unsigned long long>();
    args.unfinished = totals->as<unsigned long long>() + 1;
    // Safety bounds, not the measure: a round that waits this long counts as TIMEOUT errors (a
    // loaded host may park a thread for a long time; the GPU never comes near them).
    args.budget_ns = 600 * kSecond;
    args.wait_budget_ns = 20 * kSecond;
    auto seconds = bench::gpu::run_raw_driver(args, agents, per_block);
    Row row = best;
    row.errors = 0;
    row.first_error.clear();
    if (!seconds) {
      note_error(row, seconds.status().to_string());
      best = row;
      break;
    }
    unsigned long long t[2] = {0, 0};
    (void)accel::copy_from_device(t, totals->as<void>(), sizeof(t));
    std::vector<test::RawCommandRecord> got(commands);
    (void)accel::copy_from_device(got.data(), records->as<void>(), commands * sizeof(got[0]));
    std::vector<std::uint64_t> rounds;
    for (std::uint64_t c = 0; c < commands; ++c) {
      const test::RawCommandRecord& rec = got[c];
      if (rec.status != static_cast<std::uint32_t>(StatusCode::OK) || rec.completions != 1 || rec.echo_ok != 1) {
        note_error(row, fmt::format("command {}: status {}, {} completions, echo {}", c, rec.status, rec.completions,
                                    rec.echo_ok));
        continue;
      }
      if (c % (std::uint64_t{lanes} * per_lane) == 0) rounds.push_back(rec.wait_ns);  // one sample per round
    }
    if (t[0] != commands) note_error(row, fmt::format("{} of {} commands completed", t[0], commands));
    counted += t[0];
    row.commands = t[0];
    row.seconds = *seconds;
    if (r == 0) continue;
    row.commands_per_second = static_cast<double>(row.commands) / row.seconds;
    fill_latency(row, rounds);
    if (row.errors != 0 || best.errors != 0) {
      if (best.errors == 0) best = row;
    } else if (row.commands_per_second > best.commands_per_second) {
      best = row;
    }
  }
  const std::uint32_t exits = service.value()->stop();
  if (exits != 0) note_error(best, fmt::format("{} null controller agents ran out of budget", exits));
  const std::uint64_t posted = controller_completions(controller, qids);
  if (posted != counted)
    note_error(best, fmt::format("the null controller posted {} completions for {} commands", posted, counted));
  best.doorbells_per_command =
      counted == 0 ? 0 : static_cast<double>(queues.doorbell_writes()) / static_cast<double>(counted);
  return best;
}

void print_row(const Row& r) {
  std::printf(
      "%-34s agents=%-5u batch=%-6u queues=%-4u commands=%-10llu %8.3f s %10.3f M commands/s  "
      "latency p50 %9.1f us p99 %9.1f us max %9.1f us  doorbells/cmd=%.3f errors=%llu%s%s\n",
      r.path.c_str(), r.agents, r.batch, r.queues, static_cast<unsigned long long>(r.commands), r.seconds,
      r.commands_per_second / 1e6, r.p50_us, r.p99_us, r.max_us, r.doorbells_per_command,
      static_cast<unsigned long long>(r.errors), r.errors ? " first: " : "", r.first_error.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each row reaches a log as it ends, also when the run is cut off
  Options o;
  if (const int status = tutti::bench::gpu::parse_submit_rate_options(argc, argv, o); status != -1) return status;
  // Load every kernel at start: with CUDA's lazy loading the first launch of a kernel waits for the
  // running persistent null controller (docs/gpu.md, "Pitfall"). An explicit setting wins.
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  if constexpr (tutti::accel::kProfile == tutti::accel::Profile::cuda) {
    auto probe = tutti::accel::allocate_device(4096);
    if (!probe) {
      std::fprintf(stderr, "no usable CUDA device (%s): skipping (exit 77)\n", probe.status().to_string().c_str());
      return 77;
    }
    tutti::accel::free_device(*probe);
  }
  const std::uint32_t units = tutti::bench::gpu::agent_units();
  std::printf("agents: %s\n", tutti::bench::gpu::agent_description().c_str());
  std::printf(
      "4 KiB Read commands against the null controller (no data moves), queue depth %u, %u queue pairs, "
      "%llu commands per measured run, best of %u after a warm-up run\n",
      o.depth, o.queues, static_cast<unsigned long long>(o.commands), o.repeat);
  void* stream = tutti::bench::gpu::create_stream();
  std::vector<Row> rows;
  for (std::uint32_t batch : o.batch_sizes) {
    rows.push_back(run_runtime(o, batch, stream));
    print_row(rows.back());
  }
  tutti::bench::gpu::destroy_stream(stream);
  if constexpr (tutti::accel::kProfile == tutti::accel::Profile::cuda) {
    std::vector<std::pair<std::uint32_t, std::uint32_t>> shapes = o.shapes;
    if (shapes.empty()) shapes = {{o.queues, 1}, {units, 1}, {units * 4, 4}};
    for (bool mapped : {false, true})
      for (const auto& [warps, per_block] : shapes) {
        rows.push_back(run_raw(o, warps, per_block, mapped));
        print_row(rows.back());
      }
  } else {
    for (std::uint32_t threads : o.raw_threads) {
      rows.push_back(run_raw(o, threads, 1, false));
      print_row(rows.back());
    }
  }
  double best_runtime = 0, best_raw = 0;
  std::uint64_t errors = 0;
  for (const Row& r : rows) {
    errors += r.errors;
    if (r.path == "runtime")
      best_runtime = std::max(best_runtime, r.commands_per_second);
    else if (r.path == "raw")
      best_raw = std::max(best_raw, r.commands_per_second);
  }
  std::printf(
      "ratio: best runtime (local_nvme DataPath through the runtime API) / best raw queue protocol = %.3f "
      "(%.3f / %.3f M commands/s)\n",
      best_raw > 0 ? best_runtime / best_raw : 0.0, best_runtime / 1e6, best_raw / 1e6);
  if (!o.json.empty()) {
    nlohmann::json j = {{"agents", tutti::bench::gpu::agent_description()},
                        {"profile", tutti::accel::kProfile == tutti::accel::Profile::cuda ? "cuda" : "host"},
                        {"depth", o.depth},
                        {"queues", o.queues},
                        {"ratio_runtime_to_raw", best_raw > 0 ? best_runtime / best_raw : 0.0},
                        {"rows", nlohmann::json::array()}};
    for (const Row& r : rows)
      j["rows"].push_back({{"path", r.path},
                           {"agents", r.agents},
                           {"batch", r.batch},
                           {"queues", r.queues},
                           {"commands", r.commands},
                           {"seconds", r.seconds},
                           {"commands_per_second", r.commands_per_second},
                           {"latency_p50_us", r.p50_us},
                           {"latency_p99_us", r.p99_us},
                           {"latency_max_us", r.max_us},
                           {"doorbells_per_command", r.doorbells_per_command},
                           {"errors", r.errors},
                           {"first_error", r.first_error}});
    if (FILE* f = std::fopen(o.json.c_str(), "w")) {
      std::fputs(j.dump(2).c_str(), f);
      std::fclose(f);
    }
  }
  return errors == 0 ? 0 : 1;
}
