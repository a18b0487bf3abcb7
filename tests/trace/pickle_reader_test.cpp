#include "trace/pickle_reader.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "trace/python_pickles.hpp"
#include "trace/pickle_builder.hpp"

namespace tidepool::trace::pickle {
namespace {

using ::testing::HasSubstr;
using namespace std::string_literals;
namespace build = test::pickle;

const Node& at(const Document& doc, const Node& dict, std::string_view key) {
  const Node* value = doc.find(dict, key);
  if (value == nullptr) throw std::runtime_error("missing key " + std::string{key});
  return *value;
}

// Checks the parts of the `plain` value of python_pickles.hpp.
void expect_plain(const Document& doc) {
  const Node& root = doc.node(doc.root());
  ASSERT_EQ(root.kind, Kind::dict);
  const Node& ints = at(doc, root, "a");
  ASSERT_EQ(ints.kind, Kind::list);
  ASSERT_EQ(ints.items.size(), 13u);
  const std::int64_t expected[] = {1, -1, 255, 256, 65535, 65536, INT32_MIN, std::int64_t{1} << 31,
                                   INT64_MAX, INT64_MIN};
  for (std::size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(doc.node(ints.items[i]).kind, Kind::integer) << i;
    EXPECT_EQ(doc.node(ints.items[i]).integer, expected[i]) << i;
  }
  for (std::size_t i = 10; i < 13; ++i) EXPECT_EQ(doc.node(ints.items[i]).kind, Kind::big_integer) << i;
  EXPECT_EQ(at(doc, root, "f").kind, Kind::floating);
  EXPECT_EQ(at(doc, root, "f").floating, 1.5);
  EXPECT_EQ(at(doc, root, "s").text, "h\xc3\xa9llo");
  EXPECT_EQ(at(doc, root, "t").kind, Kind::tuple);
  EXPECT_EQ(at(doc, root, "t").items.size(), 1u);
  EXPECT_EQ(at(doc, root, "t2").items.size(), 2u);
  EXPECT_EQ(at(doc, root, "t3").items.size(), 3u);
  EXPECT_EQ(at(doc, root, "t4").items.size(), 4u);
  EXPECT_EQ(at(doc, root, "e").kind, Kind::tuple);
  EXPECT_TRUE(at(doc, root, "e").items.empty());
  EXPECT_EQ(at(doc, root, "n").kind, Kind::none);
  EXPECT_EQ(at(doc, root, "T").kind, Kind::boolean);
  EXPECT_EQ(at(doc, root, "T").integer, 1);
  EXPECT_EQ(at(doc, root, "F").integer, 0);
  // [[1, 2]] * 2 is one list referenced twice: the memo gives the same node.
  const Node& shared = at(doc, root, "shared");
  ASSERT_EQ(shared.items.size(), 2u);
  EXPECT_EQ(shared.items[0], shared.items[1]);
  EXPECT_EQ(doc.node(shared.items[0]).items.size(), 2u);
  const Node& y = at(doc, at(doc, at(doc, root, "nested"), "x"), "y");
  ASSERT_EQ(y.kind, Kind::list);
  ASSERT_EQ(y.items.size(), 1u);
  EXPECT_EQ(doc.node(y.items[0]).kind, Kind::list);
}

TEST(PickleReader, ReadsWhatCPythonWritesInEveryProtocol) {
  for (const std::string* data : {&test::kPlainProtocol2, &test::kPlainProtocol3, &test::kPlainProtocol4,
                                  &test::kPlainProtocol5}) {
    SCOPED_TRACE(static_cast<int>(static_cast<unsigned char>((*data)[1])));
    Expected<Document> doc = parse(*data);
    ASSERT_TRUE(doc) << doc.error().message();
    expect_plain(*doc);
  }
}

TEST(PickleReader, ReadsBytesSetsAndBytearraysOfProtocol5) {
  Expected<Document> doc = parse(test::kFullProtocol5);
  ASSERT_TRUE(doc) << doc.error().message();
  expect_plain(*doc);
  const Node& root = doc->node(doc->root());
  EXPECT_EQ(at(*doc, root, "b").kind, Kind::bytes);
  EXPECT_EQ(at(*doc, root, "b").text, std::string_view("\x00\x01", 2));
  EXPECT_EQ(at(*doc, root, "set").kind, Kind::set);
  ASSERT_EQ(at(*doc, root, "set").items.size(), 1u);
  EXPECT_EQ(doc->node(at(*doc, root, "set").items[0]).integer, 7);
  EXPECT_EQ(at(*doc, root, "fs").kind, Kind::set);
  EXPECT_EQ(at(*doc, root, "ba").text, "xy");
}

TEST(PickleReader, RefusesTheGlobalThatProtocol2WritesForBytes) {
  Expected<Document> doc = parse(test::kFullProtocol2);
  ASSERT_FALSE(doc);
  EXPECT_EQ(doc.error().code(), Errc::corrupt_data);
  EXPECT_THAT(doc.error().message(), HasSubstr("opcode GLOBAL (0x63) refused"));
  // The offset of the first GLOBAL in CPython's output.
  const std::size_t offset = test::kFullProtocol2.find("c_codecs\nencode");
  ASSERT_NE(offset, std::string::npos);
  EXPECT_THAT(doc.error().message(), HasSubstr("at byte offset " + std::to_string(offset)));
}

// Each code opcode, placed where it would act, is refused by name and offset.
TEST(PickleReader, RefusesEveryOpcodeThatImportsOrCalls) {
  struct Case {
    std::string name;
    std::string body;  // after PROTO 4; the refused opcode is at offset 2 + prefix
    std::size_t prefix;
  };
  const std::string os_system = build::str("os") + build::str("system");
  const std::vector<Case> cases{
      {"GLOBAL", "cos\nsystem\n", 0},
      {"STACK_GLOBAL", os_system + "\x93", os_system.size()},
      {"REDUCE", "N)R", 2},
      {"BUILD", "}}b", 2},
      {"INST", "(ios\nsystem\n", 1},
      {"OBJ", "(N)o", 3},
      {"NEWOBJ", "N)\x81", 2},
      {"NEWOBJ_EX", "N)}\x92", 3},
      {"EXT1", "\x82\x01", 0},
      {"EXT2", "\x83\x01\x00"s, 0},
      {"EXT4", "\x84\x01\x00\x00\x00"s, 0},
      {"PERSID", "Pid\n", 0},
      {"BINPERSID", "N\x51", 1},
      {"NEXT_BUFFER", "\x97", 0},
      {"READONLY_BUFFER", "N\x98", 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Expected<Document> doc = parse(build::pickle(c.body));
    ASSERT_FALSE(doc);
    EXPECT_EQ(doc.error().code(), Errc::corrupt_data);
    EXPECT_THAT(doc.error().message(), HasSubstr("opcode " + c.name + " ("));
    EXPECT_THAT(doc.error().message(), HasSubstr("refused"));
    EXPECT_THAT(doc.error().message(), HasSubstr("at byte offset " + std::to_string(2 + c.prefix)));
  }
}

TEST(PickleReader, RefusesProtocol0TextOpcodesAndOtherProtocols) {
  Expected<Document> text = parse(build::pickle("I42\n"));
  ASSERT_FALSE(text);
  EXPECT_THAT(text.error().message(), HasSubstr("text opcode INT"));

  Expected<Document> protocol0 = parse("(lp0\nI1\na.");
  ASSERT_FALSE(protocol0);
  EXPECT_THAT(protocol0.error().message(), HasSubstr("not a pickle of protocol 2 to 5"));
  EXPECT_THAT(protocol0.error().message(), HasSubstr("at byte offset 0"));

  Expected<Document> protocol6 = parse("\x80\x06N.");
  ASSERT_FALSE(protocol6);
  EXPECT_THAT(protocol6.error().message(), HasSubstr("pickle protocol 6"));

  Expected<Document> unknown = parse(build::pickle("\xff"));
  ASSERT_FALSE(unknown);
  EXPECT_THAT(unknown.error().message(), HasSubstr("unknown pickle opcode 0xff at byte offset 2"));
}

TEST(PickleReader, EmptyInputIsAClearError) {
  Expected<Document> doc = parse("");
  ASSERT_FALSE(doc);
  EXPECT_EQ(doc.error().code(), Errc::corrupt_data);
  EXPECT_THAT(doc.error().message(), HasSubstr("empty"));
}

TEST(PickleReader, EveryPrefixOfAPickleIsAnErrorWithAnOffset) {
  for (const std::string* data : {&test::kPlainProtocol2, &test::kFullProtocol5}) {
    for (std::size_t length = 0; length < data->size(); ++length) {
      Expected<Document> doc = parse(std::string_view(*data).substr(0, length));
      ASSERT_FALSE(doc) << "prefix of " << length << " bytes parsed";
      EXPECT_EQ(doc.error().code(), Errc::corrupt_data);
      if (length > 0) {
        EXPECT_THAT(doc.error().message(), HasSubstr("byte offset")) << length;
      }
    }
  }
}

TEST(PickleReader, FlippedBytesNeverCrash) {
  // Every byte of a small pickle replaced by each of a few values: the parse
  // either succeeds (a different but valid pickle) or fails cleanly.
  std::size_t failures = 0;
  for (std::size_t i = 0; i < test::kFullProtocol5.size(); ++i) {
    for (unsigned char value : {0x00, 0x01, 0x7f, 0x80, 0xff, 0x28, 0x2e, 0x94, 0x68}) {
      std::string data = test::kFullProtocol5;
      data[i] = static_cast<char>(value);
      Expected<Document> doc = parse(data);
      if (!doc) {
        ++failures;
        EXPECT_EQ(doc.error().code(), Errc::corrupt_data);
        EXPECT_FALSE(doc.error().message().empty());
      }
    }
  }
  EXPECT_GT(failures, 0u);
}

TEST(PickleReader, MalformedStacksAreErrors) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"e", "APPENDS without a MARK"},
      {"](K\x01K\x02u", "SETITEMS adds to a list, expected a dict"},
      {"}(K\x01u", "odd number of values"},
      {"Na", "APPEND needs 2 values"},
      {"h\x05", "memo entry 5 read before it was stored"},
      {"NN", "STOP with 2 values"},
      {"(N", "STOP with 1 values and 1 open MARKs"},
      {"0", "POP with an empty stack"},
      {"\x8c\x10" "abc", "string of 16 bytes, but only"},
      {"\x95\xff\xff\xff\xff\x00\x00\x00\x00N"s, "FRAME of 4294967295 bytes, but only 2 bytes follow"},
      {"\x8a\x05\x01", "LONG of 5 bytes, but only 2 bytes follow"},
  };
  for (const auto& [body, message] : cases) {
    SCOPED_TRACE(body);
    Expected<Document> doc = parse(build::pickle(body));
    ASSERT_FALSE(doc);
    EXPECT_EQ(doc.error().code(), Errc::corrupt_data);
    EXPECT_THAT(doc.error().message(), HasSubstr(message));
  }
}

TEST(PickleReader, LimitsNestingDepth) {
  std::string deep;
  for (int i = 0; i < 600; ++i) deep += "](";
  for (int i = 0; i < 600; ++i) deep += "e";
  Expected<Document> refused = parse(build::pickle(deep));
  ASSERT_FALSE(refused);
  EXPECT_THAT(refused.error().message(), HasSubstr("nested deeper than 512"));
  Limits limits;
  limits.max_depth = 1000;
  Expected<Document> allowed = parse(build::pickle(deep), limits);
  ASSERT_TRUE(allowed) << allowed.error().message();
}

TEST(PickleReader, ASelfReferenceIsNotFollowed) {
  // l = []; l.append(l): a cycle through the memo. Parsing must end, and the
  // list holds itself.
  const std::string data = build::pickle("]\x94h\x00"s + "a");
  Expected<Document> doc = parse(data);
  ASSERT_TRUE(doc) << doc.error().message();
  const Node& list = doc->node(doc->root());
  ASSERT_EQ(list.items.size(), 1u);
  EXPECT_EQ(list.items[0], doc->root());
}

TEST(PickleReader, LastDuplicateKeyWins) {
  // The document's strings are views into the input: keep it alive.
  const std::string data = build::pickle("}(" + build::str("k") + "K\x01" + build::str("k") + "K\x02u");
  Expected<Document> doc = parse(data);
  ASSERT_TRUE(doc) << doc.error().message();
  const Node* value = doc->find(doc->node(doc->root()), "k");
  ASSERT_NE(value, nullptr);
  EXPECT_EQ(value->integer, 2);
  EXPECT_EQ(doc->find(doc->node(doc->root()), "missing"), nullptr);
}

namespace bounded {

// One dict whose first key is 'action' (a scan from the last key reads every
// key before it), memoized, and `events` references to it: keys x events of
// work for a reader that scans (issue 14: minutes for 6 MB).
std::string shared_dict_snapshot(std::size_t keys, std::size_t events) {
  std::string shared = "}\x94(" + build::str("action") + build::str("free_requested");
  for (std::size_t i = 0; i < keys; ++i) shared += build::str("k" + std::to_string(i)) + "K\x01";
  shared += "u";
  std::string body = "}(" + build::str("device_traces") + "](](" + shared;
  for (std::size_t i = 1; i < events; ++i) body += "h\x00"s;
  body += "eeu";
  return build::pickle(body);
}

}  // namespace bounded

TEST(PickleReader, ADictSharedByEveryEventCostsEachLookupOneProbe) {
  const std::size_t keys = 4000, events = 4000;
  const std::string data = bounded::shared_dict_snapshot(keys, events);
  Expected<Document> doc = parse(data);
  ASSERT_TRUE(doc) << doc.error().message();
  const Node& root = doc->node(doc->root());
  const Node* traces = doc->find(root, "device_traces");
  ASSERT_NE(traces, nullptr);
  const Node& entries = doc->node(traces->items[0]);
  ASSERT_EQ(entries.items.size(), events);
  const std::size_t before = doc->key_probes();
  for (NodeId event : entries.items) {
    const Node* action = doc->find(doc->node(event), "action");
    ASSERT_NE(action, nullptr);
    EXPECT_EQ(action->text, "free_requested");
    ASSERT_EQ(doc->find(doc->node(event), "absent"), nullptr);
  }
  // Two lookups per event, one probe each; a scan made keys x events.
  EXPECT_EQ(doc->key_probes() - before, 2 * events);
  // A small dict is scanned, its keys read at most once per lookup.
  const std::string small = build::pickle(build::dict({{"a", "N"}, {"b", "N"}}));
  Expected<Document> little = parse(small);
  ASSERT_TRUE(little);
  EXPECT_NE(little->find(little->node(little->root()), "a"), nullptr);
  EXPECT_LE(little->key_probes(), 2u);
}

TEST(PickleReader, AnAmplifyingPickleIsRefusedPastTheMemoryBudget) {
  // 4 MiB of EMPTY_LIST (1 byte each, a node each) in one list: ~70x the input.
  const std::size_t count = 4u << 20;
  const std::string lists = build::pickle("(" + std::string(count, ']') + "l");
  Expected<Document> refused = parse(lists);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), Errc::corrupt_data);
  EXPECT_THAT(refused.error().message(), HasSubstr("16 times the input's"));
  // So is a memo grown by MEMOIZE (one entry per byte).
  std::string memoized = "N";
  memoized += std::string(count, '\x94');
  Expected<Document> memo = parse(build::pickle(memoized));
  ASSERT_FALSE(memo);
  EXPECT_THAT(memo.error().message(), HasSubstr("would take more than"));
  // None is one node however often it occurs (before issue 14: a node each,
  // 2.8 GB for 20 MB): a list of 4 Mi Nones is 2 nodes.
  const std::string nones = build::pickle("(" + std::string(count, 'N') + "l");
  Expected<Document> accepted = parse(nones);
  ASSERT_TRUE(accepted) << accepted.error().message();
  EXPECT_EQ(accepted->size(), 2u);
  EXPECT_EQ(accepted->node(accepted->root()).items.size(), count);
}

}  // namespace
}  // namespace tidepool::trace::pickle
