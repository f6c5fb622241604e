// The index of a KV store: block key -> record, in LMDB (Debian's liblmdb), which gives the two
// things the store needs natively: crash consistency (copy-on-write B+tree, a commit is durable
// when mdb_txn_commit returns, a crash leaves the last committed state) and readers in other
// processes (MVCC: a read transaction sees the last commit, never blocks the writer).
//
//   <dir>/index.mdb, <dir>/index.mdb-lock   one LMDB environment (MDB_NOSUBDIR), two databases:
//     "meta"    "format"          -> JSON {format_version, namespace, layout, capacity_bytes}
//               "next_generation" -> u64, little-endian
//     "blocks"  key (1..64 bytes) -> BlockRecord, encoded below
//
// BlockRecord encoding, little-endian, format version 1:
//     u32 magic "KVB1" | u16 version | u16 pieces P | u32 layers L | u32 slot | u64 generation |
//     u64 piece_length[P] | u64 checksum[L * P] (XXH3-64 of piece p of layer l at l * P + p) |
//     u64 XXH3-64 (seeded with XXH3-64 of the key) of every record byte before this field
// The last field catches a damaged record (LMDB does not checksum its pages): it is DATA_LOSS.
//
// LMDB rules this wrapper keeps (lmdb.h): one environment per file per process (the store opens
// it once); MDB_NOTLS so a read transaction is not tied to a thread; one write transaction at a
// time (the store's single writer). Thread-safety: every member function may be called from any
// thread; write transactions serialise inside LMDB.
#pragma once

#include <lmdb.h>
#include <xxhash.h>

#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <tutti/core/status.hpp>
#include <tutti/kv/layout.hpp>

namespace tutti::kv {

/// Most bytes of a block key (the engine's block hash).
inline constexpr std::size_t kMaxKeyBytes = 64;
/// Version of the on-disk format (records and meta).
inline constexpr std::uint32_t kFormatVersion = 1;

/// What the index holds for one visible block.
struct BlockRecord {
  std::uint32_t slot = 0;
  std::uint64_t generation = 0;              ///< unique per commit of a block into a slot
  std::vector<std::uint64_t> piece_lengths;  ///< bytes stored of each piece (the same in every layer)
  std::vector<std::uint64_t> checksums;      ///< XXH3-64, [layer * pieces + piece]

  std::uint64_t layer_bytes() const noexcept {
    std::uint64_t s = 0;
    for (auto b : piece_lengths) s += b;
    return s;
  }
};

namespace detail {
inline constexpr std::uint32_t kRecordMagic = 0x3142564Bu;  // "KVB1"
inline void put_u16(std::string& s, std::uint16_t v) { s.append(reinterpret_cast<const char*>(&v), 2); }
inline void put_u32(std::string& s, std::uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
inline void put_u64(std::string& s, std::uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
template <class T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
/// XXH3-64 of the record body, seeded with XXH3-64 of the key: binds the record to its key
/// without copying either.
inline std::uint64_t record_checksum(std::string_view key, std::string_view body) {
  return XXH3_64bits_withSeed(body.data(), body.size(), XXH3_64bits(key.data(), key.size()));
}
static_assert(std::endian::native == std::endian::little, "the index format is little-endian; port put_/get");
}  // namespace detail

/// Encodes `record` of `key` (format version 1).
inline std::string encode_record(std::string_view key, const BlockRecord& r, std::uint32_t layers) {
  std::string s;
  const auto pieces = static_cast<std::uint16_t>(r.piece_lengths.size());
  s.reserve(32 + 8 * (pieces + std::size_t{layers} * pieces) + 8);
  detail::put_u32(s, detail::kRecordMagic);
  detail::put_u16(s, static_cast<std::uint16_t>(kFormatVersion));
  detail::put_u16(s, pieces);
  detail::put_u32(s, layers);
  detail::put_u32(s, r.slot);
  detail::put_u64(s, r.generation);
  for (auto v : r.piece_lengths) detail::put_u64(s, v);
  for (auto v : r.checksums) detail::put_u64(s, v);
  detail::put_u64(s, detail::record_checksum(key, s));
  return s;
}

/// Decodes a record, checking its magic, version, shape (`layers`, `pieces`) and checksum.
/// Errors: DATA_LOSS naming the key's length and what is wrong.
inline Result<BlockRecord> decode_record(std::string_view key, std::string_view v, std::uint32_t layers,
                                         std::size_t pieces) {
  const std::size_t expected = 24 + 8 * (pieces + std::size_t{layers} * pieces) + 8;
  if (v.size() != expected)
    return error(StatusCode::DATA_LOSS, "index record of a {}-byte key has {} bytes; {} expected", key.size(), v.size(),
                 expected);
  const char* p = v.data();
  if (detail::get<std::uint32_t>(p) != detail::kRecordMagic || detail::get<std::uint16_t>(p + 4) != kFormatVersion ||
      detail::get<std::uint16_t>(p + 6) != pieces || detail::get<std::uint32_t>(p + 8) != layers)
    return error(StatusCode::DATA_LOSS, "index record of a {}-byte key has a wrong header", key.size());
  if (detail::get<std::uint64_t>(p + expected - 8) != detail::record_checksum(key, v.substr(0, expected - 8)))
    return error(StatusCode::DATA_LOSS, "index record of a {}-byte key fails its checksum", key.size());
  BlockRecord r;
  r.slot = detail::get<std::uint32_t>(p + 12);
  r.generation = detail::get<std::uint64_t>(p + 16);
  r.piece_lengths.resize(pieces);
  r.checksums.resize(std::size_t{layers} * pieces);
  std::memcpy(r.piece_lengths.data(), p + 24, 8 * pieces);
  std::memcpy(r.checksums.data(), p + 24 + 8 * pieces, 8 * r.checksums.size());
  return Result<BlockRecord>(std::move(r));
}

/// An LMDB error as a Status: MDB_MAP_FULL, ENOSPC, EDQUOT, MDB_READERS_FULL -> RESOURCE_EXHAUSTED;
/// MDB_CORRUPTED, MDB_INVALID, MDB_VERSION_MISMATCH -> DATA_LOSS; MDB_PANIC -> DEVICE_ERROR.
inline Status lmdb_status(int rc, std::string_view context) {
  switch (rc) {
    case MDB_MAP_FULL:
      return error(StatusCode::RESOURCE_EXHAUSTED, "{}: the index is full (its map size, options.index_map_bytes): {}",
                   context, mdb_strerror(rc));
    case MDB_READERS_FULL:
      return error(StatusCode::RESOURCE_EXHAUSTED, "{}: too many reader processes: {}", context, mdb_strerror(rc));
    case MDB_CORRUPTED:
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH: return error(StatusCode::DATA_LOSS, "{}: {}", context, mdb_strerror(rc));
    case MDB_PANIC: return error(StatusCode::DEVICE_ERROR, "{}: {}", context, mdb_strerror(rc));
    default:
      if (rc > 0) return errno_status(rc, context);  // LMDB passes errno values through
      return error(StatusCode::INTERNAL, "{}: {}", context, mdb_strerror(rc));
  }
}

/// The store's LMDB environment.
class Index {
 public:
  /// One write transaction's changes, applied all or nothing by Index::apply.
  struct Batch {
    std::vector<std::pair<std::string, std::string>> puts;  ///< key -> encoded record
    std::vector<std::string> deletes;                       ///< keys removed (absent keys are ignored)
    std::vector<std::pair<std::string, std::string>> meta;  ///< meta key -> value
  };

  /// Opens (and with `create`, creates) <dir>/index.mdb. read_only opens it MDB_RDONLY (the
  /// database must exist). map_bytes: the map size for a writer (the largest the index may grow).
  static Result<std::unique_ptr<Index>> open(const std::string& dir, bool read_only, std::uint64_t map_bytes) {
    auto index = std::unique_ptr<Index>(new Index());
    index->dir_ = dir;
    const std::string path = dir + "/index.mdb";
    int rc = mdb_env_create(&index->env_);
    if (rc != 0) return lmdb_status(rc, "index: mdb_env_create");
    if (!read_only && (rc = mdb_env_set_mapsize(index->env_, map_bytes)) != 0)
      return lmdb_status(rc, fmt::format("index: map size {} bytes", map_bytes));
    if ((rc = mdb_env_set_maxdbs(index->env_, 2)) != 0) return lmdb_status(rc, "index: mdb_env_set_maxdbs");
    const unsigned flags = MDB_NOSUBDIR | MDB_NOTLS | (read_only ? MDB_RDONLY : 0u);
    if ((rc = mdb_env_open(index->env_, path.c_str(), flags, 0644)) != 0)
      return lmdb_status(rc, fmt::format("index: open '{}'", path));
    MDB_txn* txn = nullptr;
    if ((rc = mdb_txn_begin(index->env_, nullptr, read_only ? MDB_RDONLY : 0u, &txn)) != 0)
      return lmdb_status(rc, "index: first transaction");
    const unsigned create = read_only ? 0u : MDB_CREATE;
    if ((rc = mdb_dbi_open(txn, "meta", create, &index->meta_)) != 0 ||
        (rc = mdb_dbi_open(txn, "blocks", create, &index->blocks_)) != 0) {
      mdb_txn_abort(txn);
      return lmdb_status(rc, fmt::format("index: open the databases of '{}'", path));
    }
    if ((rc = mdb_txn_commit(txn)) != 0) return lmdb_status(rc, "index: commit the databases");
    return Result<std::unique_ptr<Index>>(std::move(index));  // explicit: nvcc does not move implicitly here
  }

  ~Index() {
    if (env_) mdb_env_close(env_);
  }
  Index(const Index&) = delete;
  Index& operator=(const Index&) = delete;

  /// A read transaction: sees the last commit of any process.
  class Reader {
   public:
    ~Reader() {
      if (txn_) mdb_txn_abort(txn_);
    }
    Reader(Reader&& o) noexcept : txn_(std::exchange(o.txn_, nullptr)), index_(o.index_) {}
    Reader(const Reader&) = delete;
    /// The value of `key` in "blocks" (or "meta" with meta = true); nullopt when absent.
    Result<std::optional<std::string_view>> get(std::string_view key, bool meta = false) const {
      MDB_val k{key.size(), const_cast<char*>(key.data())}, v{};
      const int rc = mdb_get(txn_, meta ? index_->meta_ : index_->blocks_, &k, &v);
      if (rc == MDB_NOTFOUND) return std::optional<std::string_view>();
      if (rc != 0) return lmdb_status(rc, "index: get");
      return std::optional<std::string_view>(std::string_view(static_cast<const char*>(v.mv_data), v.mv_size));
    }
    /// The number of block records.
    Result<std::uint64_t> count() const {
      MDB_stat st{};
      const int rc = mdb_stat(txn_, index_->blocks_, &st);
      if (rc != 0) return lmdb_status(rc, "index: stat");
      return static_cast<std::uint64_t>(st.ms_entries);
    }
    /// Calls f(key, value) for every block record, in key order; stops at the first non-OK Status.
    Status scan(const std::function<Status(std::string_view, std::string_view)>& f) const {
      MDB_cursor* cursor = nullptr;
      int rc = mdb_cursor_open(txn_, index_->blocks_, &cursor);
      if (rc != 0) return lmdb_status(rc, "index: cursor");
      MDB_val k{}, v{};
      Status out;
      for (rc = mdb_cursor_get(cursor, &k, &v, MDB_FIRST); rc == 0 && out.is_ok();
           rc = mdb_cursor_get(cursor, &k, &v, MDB_NEXT))
        out = f(std::string_view(static_cast<const char*>(k.mv_data), k.mv_size),
                std::string_view(static_cast<const char*>(v.mv_data), v.mv_size));
      mdb_cursor_close(cursor);
      if (out.is_ok() && rc != MDB_NOTFOUND) return lmdb_status(rc, "index: scan");
      return out;
    }

   private:
    friend class Index;
    Reader(MDB_txn* txn, const Index* index) : txn_(txn), index_(index) {}
    MDB_txn* txn_;
    const Index* index_;
  };

  Result<Reader> reader() const {
    MDB_txn* txn = nullptr;
    int rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn);
    if (rc == MDB_MAP_RESIZED) {  // the writer reopened with a larger map: adopt it (lmdb.h) and retry once
      rc = mdb_env_set_mapsize(env_, 0);
      if (rc == 0) rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn);
    }
    if (rc != 0) return lmdb_status(rc, "index: read transaction");
    return Reader(txn, this);
  }

  /// Applies `batch` in one write transaction; durable (synced) when it returns OK. On error
  /// nothing of it is applied and the index keeps its last commit.
  Status apply(const Batch& batch) {
    MDB_txn* txn = nullptr;
    int rc = mdb_txn_begin(env_, nullptr, 0, &txn);
    if (rc != 0) return lmdb_status(rc, "index: write transaction");
    auto fail = [&](int code, std::string_view what) {
      mdb_txn_abort(txn);
      return with_quota_note(code, lmdb_status(code, what));
    };
    for (const auto& key : batch.deletes) {
      MDB_val k{key.size(), const_cast<char*>(key.data())};
      rc = mdb_del(txn, blocks_, &k, nullptr);
      if (rc != 0 && rc != MDB_NOTFOUND) return fail(rc, "index: delete a record");
    }
    for (const auto& [key, value] : batch.puts) {
      MDB_val k{key.size(), const_cast<char*>(key.data())}, v{value.size(), const_cast<char*>(value.data())};
      if ((rc = mdb_put(txn, blocks_, &k, &v, 0)) != 0) return fail(rc, "index: put a record");
    }
    for (const auto& [key, value] : batch.meta) {
      MDB_val k{key.size(), const_cast<char*>(key.data())}, v{value.size(), const_cast<char*>(value.data())};
      if ((rc = mdb_put(txn, meta_, &k, &v, 0)) != 0) return fail(rc, "index: put meta");
    }
    if ((rc = mdb_txn_commit(txn)) != 0)
      return with_quota_note(rc, lmdb_status(rc, "index: commit"));  // aborted by LMDB
    return Status::success();
  }

 private:
  Index() = default;
  /// An EDQUOT growing index.mdb names the quota (kv/quota.hpp).
  Status with_quota_note(int rc, const Status& s) const { return rc == EDQUOT ? kv::with_quota_note(s, dir_) : s; }
  std::string dir_;
  MDB_env* env_ = nullptr;
  MDB_dbi meta_ = 0, blocks_ = 0;
};

}  // namespace tutti::kv
