#include "common/Bytes.h"

#include <gtest/gtest.h>

#include "common/Error.h"

using zeroshard::Error;
using zeroshard::format_gib;
using zeroshard::parse_bytes;

TEST(Bytes, DecimalAndBinaryUnits) {
  EXPECT_EQ(parse_bytes("80GB", "--gpu-mem"), 80'000'000'000ULL);
  EXPECT_EQ(parse_bytes("80GiB", "--gpu-mem"), 80ULL << 30);
  EXPECT_EQ(parse_bytes("1.5TiB", "--nvme"), 3ULL << 39);
  EXPECT_EQ(parse_bytes("2TB", "--nvme"), 2'000'000'000'000ULL);
  EXPECT_EQ(parse_bytes("512 MiB", "x"), 512ULL << 20);
  EXPECT_EQ(parse_bytes("4096", "x"), 4096ULL);
  EXPECT_EQ(parse_bytes("1e9", "x"), 1'000'000'000ULL);
  EXPECT_EQ(parse_bytes("16gb", "x"), 16'000'000'000ULL);
}

TEST(Bytes, RejectsUnknownUnitNamingFlagAndValue) {
  try {
    parse_bytes("80XB", "--gpu-mem");
    FAIL() << "80XB accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--gpu-mem"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'80XB'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("GiB"), std::string::npos) << msg;
  }
}

TEST(Bytes, RejectsZeroNegativeAndEmpty) {
  EXPECT_THROW(parse_bytes("0GB", "x"), Error);
  EXPECT_THROW(parse_bytes("-5GB", "x"), Error);
  EXPECT_THROW(parse_bytes("", "x"), Error);
  EXPECT_THROW(parse_bytes("GB", "x"), Error);
  EXPECT_THROW(parse_bytes("nanGB", "x"), Error);
}

TEST(Bytes, FormatsGibWithTwoDecimals) {
  EXPECT_EQ(format_gib(80e9), "74.51");
  EXPECT_EQ(format_gib(1024.0 * 1024 * 1024), "1.00");
  EXPECT_EQ(format_gib(0), "0.00");
}
