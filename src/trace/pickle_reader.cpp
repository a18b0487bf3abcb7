#include "trace/pickle_reader.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <unordered_map>

namespace tidepool::trace::pickle {

const char* kind_name(Kind kind) noexcept {
  switch (kind) {
    case Kind::none: return "None";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::big_integer: return "int (wider than 64 bits)";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::bytes: return "bytes";
    case Kind::list: return "list";
    case Kind::tuple: return "tuple";
    case Kind::dict: return "dict";
    case Kind::set: return "set";
  }
  return "?";
}

const Node* Document::find(const Node& dict, std::string_view key) const {
  if (dict.items.size() > kIndexedDictItems) {
    const auto id = static_cast<NodeId>(&dict - nodes_.data());
    if (auto indexed = index_.find(id); indexed != index_.end()) {
      ++key_probes_;
      auto found = indexed->second.find(key);
      return found == indexed->second.end() ? nullptr : &nodes_[found->second];
    }
  }
  // Last match wins, as when Python builds the dict.
  for (std::size_t i = dict.items.size(); i >= 2; i -= 2) {
    const Node& k = nodes_[dict.items[i - 2]];
    ++key_probes_;
    if (k.kind == Kind::string && k.text == key) return &nodes_[dict.items[i - 1]];
  }
  return nullptr;
}

namespace {

// The opcodes, named as in CPython's pickletools.
enum Opcode : std::uint8_t {
  MARK = '(', STOP = '.', POP = '0', POP_MARK = '1', DUP = '2',
  FLOAT = 'F', INT = 'I', BININT = 'J', BININT1 = 'K', LONG = 'L', BININT2 = 'M', NONE = 'N',
  PERSID = 'P', BINPERSID = 'Q', REDUCE = 'R', STRING = 'S', BINSTRING = 'T',
  SHORT_BINSTRING = 'U', UNICODE = 'V', BINUNICODE = 'X', APPEND = 'a', BUILD = 'b',
  GLOBAL = 'c', DICT = 'd', EMPTY_DICT = '}', APPENDS = 'e', GET = 'g', BINGET = 'h',
  INST = 'i', LONG_BINGET = 'j', LIST = 'l', EMPTY_LIST = ']', OBJ = 'o', PUT = 'p',
  BINPUT = 'q', LONG_BINPUT = 'r', SETITEM = 's', TUPLE = 't', EMPTY_TUPLE = ')',
  SETITEMS = 'u', BINFLOAT = 'G',
  PROTO = 0x80, NEWOBJ = 0x81, EXT1 = 0x82, EXT2 = 0x83, EXT4 = 0x84, TUPLE1 = 0x85,
  TUPLE2 = 0x86, TUPLE3 = 0x87, NEWTRUE = 0x88, NEWFALSE = 0x89, LONG1 = 0x8a, LONG4 = 0x8b,
  BINBYTES = 'B', SHORT_BINBYTES = 'C',
  SHORT_BINUNICODE = 0x8c, BINUNICODE8 = 0x8d, BINBYTES8 = 0x8e, EMPTY_SET = 0x8f,
  ADDITEMS = 0x90, FROZENSET = 0x91, NEWOBJ_EX = 0x92, STACK_GLOBAL = 0x93, MEMOIZE = 0x94,
  FRAME = 0x95, BYTEARRAY8 = 0x96, NEXT_BUFFER = 0x97, READONLY_BUFFER = 0x98,
};

// Opcodes that import, call or build objects: refused, whatever follows.
const char* refused_opcode_name(std::uint8_t op) {
  switch (op) {
    case GLOBAL: return "GLOBAL";
    case STACK_GLOBAL: return "STACK_GLOBAL";
    case REDUCE: return "REDUCE";
    case BUILD: return "BUILD";
    case INST: return "INST";
    case OBJ: return "OBJ";
    case NEWOBJ: return "NEWOBJ";
    case NEWOBJ_EX: return "NEWOBJ_EX";
    case EXT1: return "EXT1";
    case EXT2: return "EXT2";
    case EXT4: return "EXT4";
    case PERSID: return "PERSID";
    case BINPERSID: return "BINPERSID";
    case NEXT_BUFFER: return "NEXT_BUFFER";
    case READONLY_BUFFER: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

// Protocol 0 text opcodes: a snapshot (protocol 2+) never needs them.
const char* text_opcode_name(std::uint8_t op) {
  switch (op) {
    case FLOAT: return "FLOAT";
    case INT: return "INT";
    case LONG: return "LONG";
    case STRING: return "STRING";
    case UNICODE: return "UNICODE";
    case GET: return "GET";
    case PUT: return "PUT";
    default: return nullptr;
  }
}

std::string hex_byte(std::uint8_t byte) {
  static constexpr char digits[] = "0123456789abcdef";
  return std::string{"0x"} + digits[byte >> 4] + digits[byte & 15];
}

}  // namespace

class Parser {
 public:
  Parser(std::string_view data, const Limits& limits) : data_(data), limits_(limits) {}

  Expected<Document> run() {
    if (data_.empty()) return Error(Errc::corrupt_data, "pickle: the input is empty");
    if (data_.size() > limits_.max_input_bytes) {
      return Error(Errc::corrupt_data, "pickle: the input is " + std::to_string(data_.size()) +
                                           " bytes, more than the limit of " +
                                           std::to_string(limits_.max_input_bytes));
    }
    if (static_cast<std::uint8_t>(data_[0]) != PROTO) {
      return corrupt(0, "not a pickle of protocol 2 to 5 (it starts with byte " +
                            hex_byte(static_cast<std::uint8_t>(data_[0])) +
                            ", not PROTO 0x80)");
    }
    budget_ = std::max(limits_.min_memory_bytes, data_.size() * limits_.memory_per_input_byte);
    doc_.nodes_.reserve(data_.size() / 16);
    stack_.reserve(1024);
    while (true) {
      const std::size_t at = pos_;
      if (pos_ >= data_.size()) return corrupt(at, "the pickle ends before its STOP opcode");
      const auto op = static_cast<std::uint8_t>(data_[pos_++]);
      if (op == STOP) {
        if (!marks_.empty() || stack_.size() != 1) {
          return corrupt(at, "STOP with " + std::to_string(stack_.size()) + " values and " +
                                 std::to_string(marks_.size()) +
                                 " open MARKs on the stack (expected one value, no MARK)");
        }
        doc_.root_ = stack_.back();
        if (Status indexed = index_dicts(at); !indexed) return std::move(indexed).error();
        return std::move(doc_);
      }
      if (Status step = execute(op, at); !step) return std::move(step).error();
      // Each opcode adds a bounded amount, so checking after each is exact
      // to within one node.
      if (Status within = check_budget(at); !within) return within.error();
    }
  }

 private:
  Error corrupt(std::size_t offset, const std::string& what) const {
    return Error(Errc::corrupt_data, "pickle: " + what + " at byte offset " + std::to_string(offset));
  }

  // --- reading the argument bytes of an opcode, bounds-checked ---
  Status need(std::size_t n, std::size_t at, const char* what) const {
    if (n > data_.size() - pos_) {
      return corrupt(at, std::string{"truncated "} + what + ": needs " + std::to_string(n) +
                             " more bytes, " + std::to_string(data_.size() - pos_) + " left");
    }
    return {};
  }
  std::uint64_t take_le(std::size_t n) {  // precondition: need(n) succeeded, n <= 8
    std::uint64_t value = 0;
    for (std::size_t i = 0; i < n; ++i) {
      value |= std::uint64_t{static_cast<std::uint8_t>(data_[pos_ + i])} << (8 * i);
    }
    pos_ += n;
    return value;
  }
  // Reads an n-byte little-endian length, then checks that many bytes follow.
  Expected<std::uint64_t> take_length(std::size_t n, std::size_t at, const char* what) {
    if (Status s = need(n, at, what); !s) return std::move(s).error();
    std::uint64_t length = take_le(n);
    if (length > data_.size() - pos_) {
      return corrupt(at, std::string{what} + " of " + std::to_string(length) + " bytes, but only " +
                             std::to_string(data_.size() - pos_) + " bytes follow");
    }
    return length;
  }

  // --- the memory budget ---
  // What a memo or index entry costs in a node-based hash map, roughly.
  static constexpr std::size_t kHashEntryBytes = 48;
  std::size_t used() const {
    return charged_ + stack_.size() * sizeof(NodeId) + marks_.size() * sizeof(std::size_t);
  }
  Status check_budget(std::size_t at) const {
    if (used() <= budget_) return {};
    return corrupt(at, "the value tree would take more than " + std::to_string(budget_) + " bytes (" +
                           std::to_string(limits_.memory_per_input_byte) + " times the input's " +
                           std::to_string(data_.size()) +
                           " bytes): the pickle amplifies (real snapshots take 4 to 8 times their size)");
  }
  // Large dicts get a hash index (Document::find), built once they are whole.
  Status index_dicts(std::size_t at) {
    for (std::size_t id = 0; id < doc_.nodes_.size(); ++id) {
      const Node& node = doc_.nodes_[id];
      if (node.kind != Kind::dict || node.items.size() <= Document::kIndexedDictItems) continue;
      auto& index = doc_.index_[static_cast<NodeId>(id)];
      index.reserve(node.items.size() / 2);
      for (std::size_t i = 0; i + 1 < node.items.size(); i += 2) {
        const Node& key = doc_.nodes_[node.items[i]];
        if (key.kind == Kind::string) index[key.text] = node.items[i + 1];  // the last wins
      }
      charged_ += (node.items.size() / 2) * kHashEntryBytes;
      if (Status within = check_budget(at); !within) return within;
    }
    return {};
  }

  // --- building nodes ---
  NodeId add(Node node) {
    charged_ += sizeof(Node);
    doc_.nodes_.push_back(std::move(node));
    return static_cast<NodeId>(doc_.nodes_.size() - 1);
  }
  // None, True and False are one node each, however often they occur.
  NodeId constant(Kind kind, std::int64_t value, NodeId& made) {
    if (made == kNoNode) made = add_scalar(kind, value);
    return made;
  }
  NodeId add_scalar(Kind kind, std::int64_t integer = 0) {
    Node node;
    node.kind = kind;
    node.integer = integer;
    return add(std::move(node));
  }
  NodeId add_text(Kind kind, std::uint64_t length) {  // precondition: length bytes follow
    Node node;
    node.kind = kind;
    node.text = data_.substr(pos_, length);
    pos_ += length;
    return add(std::move(node));
  }
  void push(NodeId id) { stack_.push_back(id); }

  // The values pushed since the last MARK: [first, stack_.end()).
  Expected<std::size_t> pop_mark(std::size_t at, const char* opcode) {
    if (marks_.empty()) return corrupt(at, std::string{opcode} + " without a MARK before it");
    std::size_t first = marks_.back();
    marks_.pop_back();
    return first;
  }
  // The topmost value not above the innermost MARK, for opcodes that pop.
  std::size_t values_above_mark() const {
    return stack_.size() - (marks_.empty() ? 0 : marks_.back());
  }
  Status need_values(std::size_t n, std::size_t at, const char* opcode) const {
    if (values_above_mark() < n) {
      return corrupt(at, std::string{opcode} + " needs " + std::to_string(n) +
                             " values on the stack, finds " + std::to_string(values_above_mark()));
    }
    return {};
  }
  // The container the items at [first, end) go into: the value just below them.
  Expected<NodeId> target(std::size_t first, Kind kind, std::size_t at, const char* opcode) {
    const std::size_t floor = marks_.empty() ? 0 : marks_.back();
    if (first <= floor || first > stack_.size()) {
      return corrupt(at, std::string{opcode} + " has no " + kind_name(kind) + " to add to");
    }
    NodeId id = stack_[first - 1];
    if (doc_.nodes_[id].kind != kind) {
      return corrupt(at, std::string{opcode} + " adds to a " + kind_name(doc_.nodes_[id].kind) +
                             ", expected a " + kind_name(kind));
    }
    return id;
  }
  Status add_items(std::size_t first, Kind kind, std::size_t at, const char* opcode) {
    Expected<NodeId> id = target(first, kind, at, opcode);
    if (!id) return std::move(id).error();
    if (kind == Kind::dict && (stack_.size() - first) % 2 != 0) {
      return corrupt(at, std::string{opcode} + " with an odd number of values (a key without a value)");
    }
    auto& items = doc_.nodes_[*id].items;
    charged_ += (stack_.size() - first) * sizeof(NodeId);
    items.insert(items.end(), stack_.begin() + static_cast<std::ptrdiff_t>(first), stack_.end());
    stack_.resize(first);
    return {};
  }
  void collect(std::size_t first, Kind kind) {  // a new container of the values from first
    Node node;
    node.kind = kind;
    node.items.assign(stack_.begin() + static_cast<std::ptrdiff_t>(first), stack_.end());
    charged_ += node.items.size() * sizeof(NodeId);
    stack_.resize(first);
    push(add(std::move(node)));
  }

  Status memo_put(std::uint64_t index, std::size_t at) {
    if (values_above_mark() == 0) return corrupt(at, "memo store with an empty stack");
    if (memo_.insert_or_assign(index, stack_.back()).second) charged_ += kHashEntryBytes;
    return {};
  }
  Status memo_get(std::uint64_t index, std::size_t at) {
    auto it = memo_.find(index);
    if (it == memo_.end()) return corrupt(at, "memo entry " + std::to_string(index) + " read before it was stored");
    push(it->second);
    return {};
  }

  // LONG1/LONG4: `length` bytes of little-endian two's complement.
  // Precondition: length bytes follow.
  void push_long(std::uint64_t length) {
    std::string_view bytes = data_.substr(pos_, length);
    pos_ += length;
    auto byte = [&](std::size_t i) { return static_cast<std::uint8_t>(bytes[i]); };
    const bool negative = length > 0 && (byte(length - 1) & 0x80) != 0;
    // It fits in int64 when every byte past the eighth only repeats the sign.
    bool fits = true;
    if (length > 8) {
      const std::uint8_t sign_byte = negative ? 0xff : 0x00;
      for (std::size_t i = 8; i < length && fits; ++i) fits = byte(i) == sign_byte;
      fits = fits && ((byte(7) & 0x80) != 0) == negative;
    }
    if (!fits) {
      Node node;
      node.kind = Kind::big_integer;
      node.text = bytes;
      push(add(std::move(node)));
      return;
    }
    const std::size_t used = length < 8 ? static_cast<std::size_t>(length) : 8;
    std::uint64_t value = 0;
    for (std::size_t i = 0; i < used; ++i) value |= std::uint64_t{byte(i)} << (8 * i);
    if (negative && used < 8) value |= ~std::uint64_t{0} << (8 * used);
    push(add_scalar(Kind::integer, static_cast<std::int64_t>(value)));
  }

  Status execute(std::uint8_t op, std::size_t at) {
    if (const char* name = refused_opcode_name(op)) {
      return corrupt(at, std::string{"opcode "} + name + " (" + hex_byte(op) +
                             ") refused: it imports or calls code, and a plain-data pickle "
                             "never needs it");
    }
    if (const char* name = text_opcode_name(op)) {
      return corrupt(at, std::string{"protocol 0 text opcode "} + name + " (" + hex_byte(op) +
                             ") is not supported (only protocols 2 to 5)");
    }
    switch (op) {
      case PROTO: {
        if (at != 0) return corrupt(at, "PROTO after the start");
        if (Status s = need(1, at, "PROTO"); !s) return s;
        const auto version = take_le(1);
        if (version < 2 || version > 5) {
          return corrupt(at, "pickle protocol " + std::to_string(version) + " (only 2 to 5 are read)");
        }
        return {};
      }
      case FRAME: {  // protocol 4 framing: only a length, checked
        Expected<std::uint64_t> length = take_length(8, at, "FRAME");
        return length ? Status{} : Status{std::move(length).error()};
      }
      case MARK:
        if (marks_.size() >= limits_.max_depth) {
          return corrupt(at, "containers nested deeper than " + std::to_string(limits_.max_depth));
        }
        marks_.push_back(stack_.size());
        return {};
      case POP:
        if (values_above_mark() > 0) {
          stack_.pop_back();
        } else if (!marks_.empty()) {
          marks_.pop_back();
        } else {
          return corrupt(at, "POP with an empty stack");
        }
        return {};
      case POP_MARK: {
        Expected<std::size_t> first = pop_mark(at, "POP_MARK");
        if (!first) return std::move(first).error();
        stack_.resize(*first);
        return {};
      }
      case DUP:
        if (Status s = need_values(1, at, "DUP"); !s) return s;
        push(stack_.back());
        return {};

      case NONE: push(constant(Kind::none, 0, none_)); return {};
      case NEWTRUE: push(constant(Kind::boolean, 1, true_)); return {};
      case NEWFALSE: push(constant(Kind::boolean, 0, false_)); return {};
      case BININT1:
      case BININT2:
      case BININT: {
        const std::size_t n = op == BININT1 ? 1 : op == BININT2 ? 2 : 4;
        if (Status s = need(n, at, "int"); !s) return s;
        std::uint64_t raw = take_le(n);
        std::int64_t value = op == BININT ? std::int64_t{static_cast<std::int32_t>(raw)}
                                          : static_cast<std::int64_t>(raw);
        push(add_scalar(Kind::integer, value));
        return {};
      }
      case LONG1:
      case LONG4: {
        Expected<std::uint64_t> length = take_length(op == LONG1 ? 1 : 4, at, "LONG");
        if (!length) return std::move(length).error();
        if (op == LONG4 && *length > 0x7fffffffu) return corrupt(at, "LONG4 with a negative length");
        push_long(*length);
        return {};
      }
      case BINFLOAT: {
        if (Status s = need(8, at, "BINFLOAT"); !s) return s;
        std::uint64_t big_endian = 0;
        for (int i = 0; i < 8; ++i) big_endian = (big_endian << 8) | static_cast<std::uint8_t>(data_[pos_++]);
        Node node;
        node.kind = Kind::floating;
        node.floating = std::bit_cast<double>(big_endian);
        push(add(std::move(node)));
        return {};
      }

      case SHORT_BINUNICODE:
      case BINUNICODE:
      case BINUNICODE8:
      case SHORT_BINSTRING:
      case BINSTRING:
      case SHORT_BINBYTES:
      case BINBYTES:
      case BINBYTES8:
      case BYTEARRAY8: {
        const bool is_text = op == SHORT_BINUNICODE || op == BINUNICODE || op == BINUNICODE8 ||
                             op == SHORT_BINSTRING || op == BINSTRING;
        const std::size_t width = (op == SHORT_BINUNICODE || op == SHORT_BINSTRING || op == SHORT_BINBYTES)
                                      ? 1
                                      : (op == BINUNICODE8 || op == BINBYTES8 || op == BYTEARRAY8) ? 8 : 4;
        Expected<std::uint64_t> length = take_length(width, at, is_text ? "string" : "bytes");
        if (!length) return std::move(length).error();
        if (op == BINSTRING && *length > 0x7fffffffu) return corrupt(at, "BINSTRING with a negative length");
        push(add_text(is_text ? Kind::string : Kind::bytes, *length));
        return {};
      }

      case EMPTY_DICT: collect(stack_.size(), Kind::dict); return {};
      case EMPTY_LIST: collect(stack_.size(), Kind::list); return {};
      case EMPTY_TUPLE: collect(stack_.size(), Kind::tuple); return {};
      case EMPTY_SET: collect(stack_.size(), Kind::set); return {};
      case TUPLE1:
      case TUPLE2:
      case TUPLE3: {
        const std::size_t n = static_cast<std::size_t>(op - TUPLE1) + 1;
        if (Status s = need_values(n, at, "TUPLE1/2/3"); !s) return s;
        collect(stack_.size() - n, Kind::tuple);
        return {};
      }
      case TUPLE:
      case LIST:
      case DICT:
      case FROZENSET: {
        const char* name = op == TUPLE ? "TUPLE" : op == LIST ? "LIST" : op == DICT ? "DICT" : "FROZENSET";
        Expected<std::size_t> first = pop_mark(at, name);
        if (!first) return std::move(first).error();
        const Kind kind = op == TUPLE ? Kind::tuple : op == LIST ? Kind::list : op == DICT ? Kind::dict : Kind::set;
        if (kind == Kind::dict && (stack_.size() - *first) % 2 != 0) {
          return corrupt(at, "DICT with an odd number of values (a key without a value)");
        }
        collect(*first, kind);
        return {};
      }
      case APPEND:
        if (Status s = need_values(2, at, "APPEND"); !s) return s;
        return add_items(stack_.size() - 1, Kind::list, at, "APPEND");
      case SETITEM:
        if (Status s = need_values(3, at, "SETITEM"); !s) return s;
        return add_items(stack_.size() - 2, Kind::dict, at, "SETITEM");
      case APPENDS:
      case SETITEMS:
      case ADDITEMS: {
        const char* name = op == APPENDS ? "APPENDS" : op == SETITEMS ? "SETITEMS" : "ADDITEMS";
        Expected<std::size_t> first = pop_mark(at, name);
        if (!first) return std::move(first).error();
        const Kind kind = op == APPENDS ? Kind::list : op == SETITEMS ? Kind::dict : Kind::set;
        return add_items(*first, kind, at, name);
      }

      case MEMOIZE: return memo_put(memo_.size(), at);
      case BINPUT:
      case LONG_BINPUT: {
        const std::size_t n = op == BINPUT ? 1 : 4;
        if (Status s = need(n, at, "memo index"); !s) return s;
        return memo_put(take_le(n), at);
      }
      case BINGET:
      case LONG_BINGET: {
        const std::size_t n = op == BINGET ? 1 : 4;
        if (Status s = need(n, at, "memo index"); !s) return s;
        return memo_get(take_le(n), at);
      }
      default:
        return corrupt(at, "unknown pickle opcode " + hex_byte(op));
    }
  }

  std::string_view data_;
  Limits limits_;
  std::size_t pos_ = 0;
  Document doc_;
  std::vector<NodeId> stack_;
  std::vector<std::size_t> marks_;  // stack sizes at each open MARK
  std::unordered_map<std::uint64_t, NodeId> memo_;
  static constexpr NodeId kNoNode = ~NodeId{0};
  NodeId none_ = kNoNode, true_ = kNoNode, false_ = kNoNode;
  std::size_t budget_ = 0;   // bytes the tree may take
  std::size_t charged_ = 0;  // bytes of nodes, items, memo and index entries so far
};

Expected<Document> parse(std::string_view data, const Limits& limits) {
  return Parser(data, limits).run();
}

}  // namespace tidepool::trace::pickle
