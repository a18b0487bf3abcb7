// A restricted reader of Python pickles (protocols 2 to 5) that holds plain
// data only: None, bools, ints, floats, str, bytes, lists, tuples, dicts and
// sets. Every opcode that looks up a class or calls code (GLOBAL,
// STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, EXT*, PERSID...) is refused
// with an error naming it and its byte offset, so an untrusted file can never
// make the reader run anything: it only ever builds the value tree below.
//
// Every read is bounds-checked; a truncated, corrupted or empty input is a
// corrupt_data error with the byte offset, never a crash.
//
// Bounded: the memory the tree takes (nodes, container items, memo entries,
// the stack, dictionary indexes) is counted as it grows and refused past
// Limits::memory_per_input_byte times the input (16: a snapshot takes 2-5x),
// and every key lookup (Document::find) is one hash probe for a dict of
// more than kIndexedDictItems items, so no input costs more than linear work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tidepool/error.hpp"

namespace tidepool::trace::pickle {

enum class Kind : std::uint8_t {
  none,
  boolean,
  integer,      // fits in int64
  big_integer,  // LONG1/LONG4 too wide for int64: kept as its little-endian bytes
  floating,
  string,       // UTF-8 as stored (not validated: only compared and copied)
  bytes,
  list,
  tuple,
  dict,         // items alternate key, value, in insertion order
  set,          // set and frozenset
};

/// Name of a kind, for error messages: "int", "str", "dict", ...
const char* kind_name(Kind kind) noexcept;

/// Index of a node in a `Document`.
using NodeId = std::uint32_t;

struct Node {
  Kind kind = Kind::none;
  std::int64_t integer = 0;       // boolean (0/1) and integer
  double floating = 0.0;
  std::string_view text;          // string, bytes, big_integer: a view into the input
  std::vector<NodeId> items;      // list, tuple, set; dict: key, value, key, value...
};

/// The value tree of one pickle. Nodes may be shared (the pickle memo) and
/// even form cycles (a list that holds itself), so walk it along known
/// paths, never recursively without a depth bound.
/// Views (`Node::text`) point into the input: the input must outlive it.
class Document {
 public:
  NodeId root() const { return root_; }
  const Node& node(NodeId id) const { return nodes_[id]; }
  std::size_t size() const { return nodes_.size(); }

  /// The value of `key` in dict `dict` (the last one if repeated), or null
  /// when absent: a scan of a small dict, one hash probe of a larger one (a
  /// dict shared through the memo by every event costs each event O(1)).
  /// Precondition: `dict` is a node of this document of kind dict.
  const Node* find(const Node& dict, std::string_view key) const;

  /// Dicts with more items (keys and values) than this get a hash index.
  static constexpr std::size_t kIndexedDictItems = 16;
  /// Keys compared (or hash probes made) by find() so far: the work bound's
  /// measure (not synchronized: a Document is read by one thread).
  std::size_t key_probes() const { return key_probes_; }

 private:
  friend class Parser;
  mutable std::size_t key_probes_ = 0;
  std::vector<Node> nodes_;
  NodeId root_ = 0;
  // Per large dict: its string keys to their last value.
  std::unordered_map<NodeId, std::unordered_map<std::string_view, NodeId>> index_;
};

struct Limits {
  /// Deepest nesting of containers accepted.
  std::size_t max_depth = 512;
  /// Largest input accepted (node ids are 32-bit).
  std::size_t max_input_bytes = std::size_t{1} << 32;
  /// The most memory the parse may take, as a multiple of the input's size
  /// (with a floor of min_memory_bytes for tiny inputs); past it the input is
  /// refused (corrupt_data naming the budget and the offset).
  std::size_t memory_per_input_byte = 16;
  std::size_t min_memory_bytes = std::size_t{1} << 20;
};

/// Parses a whole pickle. Errors (corrupt_data, each with the byte offset):
/// not a protocol 2-5 pickle, a refused opcode, an unknown opcode, a read past
/// the end, a malformed stack (a missing MARK, a SETITEMS on a list, ...),
/// nesting deeper than `limits.max_depth`, a tree larger than the memory
/// budget of `limits`.
Expected<Document> parse(std::string_view data, const Limits& limits = {});

}  // namespace tidepool::trace::pickle
