#pragma once
// Named places where tests make a rank crash or stall, as a real fault would, with no
// mock of the failing part. Off unless the environment asks:
//   ZS_TEST_KILL_AT=<point>[@<hit>]   SIGKILL at the hit-th pass of <point> (default 1st)
//   ZS_TEST_PAUSE_AT=<point>[@<hit>]  sleep ZS_TEST_PAUSE_SECONDS (default 2) there instead
//   ZS_TEST_SKIP_AT=<point>[@<hit>]   fault_skip(<point>) is true at that hit: the caller
//                                     leaves out what it does there, as a bug on one rank
//                                     would (a stage-3 gather not issued)
//   ZS_TEST_KILL_RANK=<r>             only on the process whose RANK is r (every hook)
// The points and where they sit are listed in docs/reliability.md.
namespace zeroshard {

void fault_point(const char* point);
// True at the pass ZS_TEST_SKIP_AT names (passes counted apart from fault_point's).
bool fault_skip(const char* point);

}  // namespace zeroshard
