#include "common/DidYouMean.h"

#include <gtest/gtest.h>

using zeroshard::closest_match;
using zeroshard::edit_distance;

TEST(DidYouMean, EditDistanceKnownValues) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3);
  EXPECT_EQ(edit_distance("", "abc"), 3);
  EXPECT_EQ(edit_distance("stage", "stage"), 0);
  EXPECT_EQ(edit_distance("stgae", "stage"), 1);  // one swap
  EXPECT_EQ(edit_distance("ca", "abc"), 3);
}

TEST(DidYouMean, SuggestsTyposOnly) {
  const std::vector<std::string> keys{"stage", "overlap_comm", "reduce_bucket_size"};
  EXPECT_EQ(closest_match("stgae", keys), "stage");
  EXPECT_EQ(closest_match("reduce_bucket_sise", keys), "reduce_bucket_size");
  EXPECT_EQ(closest_match("completely_different", keys), "");
}
