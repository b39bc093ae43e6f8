"""Where the time of `./zs test` went: each leg's wall time, the slowest tests, the total
against the budget, and the tests that grew most since the checked-in record.

Reads what the legs leave in their build folders' test-reports/: legs.tsv (one line per
part: name, seconds, exit status; written by tools/zs/setup.sh `timed`), ctest.xml
(CTest's JUnit report: every C++ test case and every Python file) and python_*.xml
(pytest's JUnit report of one file: its cases). Standard library only: it runs under the
venv's interpreter or Debian's.

usage: test_times.py summary|record RECORD LEGS_TSV LEG=REPORT_DIR ...
       test_times.py costs RECORD
  summary   prints the table; warns (never fails) when over the budget
  record    writes RECORD from these reports (after a full, passing `./zs test`)
  costs     each Python test file's recorded seconds on the main leg, as `CTEST_NAME SECONDS`
            lines: the CTest COST of its entry (bindings/CMakeLists.txt), so that a fresh
            build folder, which has no CTestCostData yet, starts the longest first
"""
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

SLOWEST = 20
GREW = 10
# A test counts as grown when it takes this much longer than recorded (shared machines
# drift by 10-25% between hours; a few seconds either way is noise).
GREW_SECONDS, GREW_RATIO = 5.0, 1.3


def testcases(path):
    """The <testcase> elements of one JUnit report; none where it is missing or was cut
    off mid-write (a killed file: its CTest entry still counts)."""
    try:
        return list(ET.parse(path).iter("testcase"))
    except (OSError, ET.ParseError):
        return []


def case_seconds(case):
    return float(case.get("time") or 0)


def python_cases(report_dir):
    """{'test_file.py::case': seconds} from the pytest reports in report_dir."""
    cases = {}
    for name in sorted(os.listdir(report_dir)):
        if name.startswith("python_") and name.endswith(".xml"):
            for case in testcases(os.path.join(report_dir, name)):
                module = case.get("classname", "").split(".")[-1]
                cases[f"{module}.py::{case.get('name')}"] = case_seconds(case)
    return cases


def ctest_name(name):
    """A CTest name as the record keeps it: a value-parametrized GoogleTest case's name
    ends in its parameter's bytes (`  # GetParam() = 16-byte object <...>`, addresses
    among them), different at every run; the case's own name stays."""
    return name.split("  # GetParam() = ", 1)[0]


def ctest_cases(report_dir):
    """{'name': seconds} of every CTest entry (a C++ test case, a Python file, a fixture)."""
    return {ctest_name(case.get("name")): case_seconds(case)
            for case in testcases(os.path.join(report_dir, "ctest.xml"))}


def leg_tests(report_dir):
    """Every test of one leg: C++ cases and fixtures by their CTest name, Python by case
    (a Python file's CTest entry stands only where pytest left no report of its cases)."""
    ctest, python = ctest_cases(report_dir), python_cases(report_dir)
    files_with_cases = {"python_" + k.split(".py::")[0] for k in python}
    tests = {k: v for k, v in ctest.items() if k not in files_with_cases}
    tests.update(python)
    return tests


def read_legs(path):
    legs = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 3:
                    legs.append((parts[0], int(parts[1]), int(parts[2])))
    return legs


def minutes(seconds):
    return f"{int(seconds) // 60} min {int(seconds) % 60:02d} s"


def collect(pairs):
    """{'leg:test': seconds} over every LEG=REPORT_DIR."""
    tests = {}
    for pair in pairs:
        leg, folder = pair.split("=", 1)
        if os.path.isdir(folder):
            tests.update({f"{leg}:{k}": v for k, v in leg_tests(folder).items()})
    return tests


def read_record(path):
    """The checked-in record, or {} (with a line saying why) where it cannot be read."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        print(f"zs: the record {path} cannot be read ({e}); compared with nothing")
        return {}


def summary(record_path, legs_path, pairs):
    record = read_record(record_path)
    budget = 60 * record.get("budget_minutes", 45)
    legs, tests = read_legs(legs_path), collect(pairs)
    print("== where the time of ./zs test went ==")
    for name, seconds, status in legs:
        print(f"  {minutes(seconds):>13}  {name}{'' if status == 0 else f' (exit {status})'}")
    total = sum(seconds for _, seconds, _ in legs)
    print(f"  {minutes(total):>13}  in all, against a budget of {minutes(budget)} "
          f"({100 * total / budget:.0f}%)")
    if tests:
        print(f"the {SLOWEST} slowest tests ({len(tests)} in all, "
              f"{minutes(sum(tests.values()))} of test time):")
        for name, seconds in sorted(tests.items(), key=lambda kv: -kv[1])[:SLOWEST]:
            print(f"  {seconds:8.1f} s  {name}")
    was = record.get("tests", {})
    if was and tests:
        grew = [(name, was[name], now) for name, now in tests.items()
                if name in was and now > was[name] + GREW_SECONDS and now > was[name] * GREW_RATIO]
        new = {name: now for name, now in tests.items() if name not in was}
        when = record.get("recorded", {})
        print(f"against the record of {when.get('date', '?')} at {when.get('commit', '?')} "
              f"({minutes(sum(was.values()))} of test time):")
        for name, before, now in sorted(grew, key=lambda g: g[1] - g[2])[:GREW]:
            print(f"  {now - before:+8.1f} s  {name} ({before:.1f} s then, {now:.1f} s now)")
        if not grew:
            print("  no test grew by more than "
                  f"{GREW_SECONDS:.0f} s and {100 * (GREW_RATIO - 1):.0f}%")
        if new:
            top = sorted(new.items(), key=lambda kv: -kv[1])[:5]
            print(f"  {len(new)} tests not in the record, {sum(new.values()):.1f} s; the longest: "
                  + ", ".join(f"{k} {v:.1f} s" for k, v in top))
    if legs and total > budget:
        print(f"zs: warning: ./zs test took {minutes(total)}, over its budget of "
              f"{minutes(budget)}: CI stops at 90 minutes. docs/development.md says how "
              "the time is kept.")
    return 0


def record_times(record_path, legs_path, pairs):
    old = read_record(record_path)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(record_path) or ".").stdout.strip()
    tests = collect(pairs)
    data = {
        "about": "Seconds each test took in one full ./zs test on the project's 2-core machine; "
                 "./zs test compares a run with it (tools/zs/test_times.py).",
        "budget_minutes": old.get("budget_minutes", 45),
        "recorded": {"date": time.strftime("%Y-%m-%d"), "commit": commit,
                     "legs": {name: seconds for name, seconds, _ in read_legs(legs_path)}},
        "tests": {name: round(seconds, 1) for name, seconds in sorted(tests.items())},
    }
    tmp = record_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, record_path)
    print(f"recorded {len(tests)} tests' seconds in {record_path}")
    return 0


def costs(record_path):
    files = {}
    for name, seconds in read_record(record_path).get("tests", {}).items():
        leg, _, case = name.partition(":")
        if leg == "main" and ".py::" in case:
            test_file = case.split(".py::", 1)[0]
            files[test_file] = files.get(test_file, 0.0) + seconds
    for test_file, seconds in sorted(files.items()):
        print(f"python_{test_file} {max(1, round(seconds))}")
    return 0


def main(argv):
    if len(argv) == 2 and argv[0] == "costs":
        return costs(argv[1])
    if len(argv) < 3 or argv[0] not in ("summary", "record"):
        print(__doc__, file=sys.stderr)
        return 2
    verb, record_path, legs_path, pairs = argv[0], argv[1], argv[2], argv[3:]
    return (summary if verb == "summary" else record_times)(record_path, legs_path, pairs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
