# cmake -DINPUT=FILE -DOUTPUT=FILE.cpp -DSYMBOL=NAME -DHEADER=path.hpp -P EmbedFile.cmake
# Writes a C++ source that defines the bytes of INPUT as
# tidepool::report::detail::NAME[] and NAMESize (declared in HEADER): how
# Chart.js becomes part of the tidepool command at build time.
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR size "${hex_length} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by cmake/EmbedFile.cmake at build time: do not edit.\n"
  "#include \"${HEADER}\"\n"
  "namespace tidepool::report::detail {\n"
  "const unsigned char ${SYMBOL}[] = {${bytes}0};\n"
  "const std::size_t ${SYMBOL}Size = ${size};\n"
  "}  // namespace tidepool::report::detail\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
