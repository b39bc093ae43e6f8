#pragma once
#include <string>
#include <vector>

namespace zeroshard {

// Edit distance counting a swap of neighbours as one edit, for suggesting the key a
// user probably meant.
int edit_distance(const std::string& a, const std::string& b);

// The candidate closest to `word`, or "" when none is close enough to be a typo
// (distance at most a third of the word's length, and at least 1 allowed).
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace zeroshard
