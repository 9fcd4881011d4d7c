"""Combine the JUnit reports of the test partitions into one table.

    python3 .github/scripts/junit-summary.py EXPECTED_PARTITIONS FILE...

Prints a markdown table (tests, failures, errors, skipped per partition and in total) and
exits 1 when a partition's report is missing or any test failed.
"""
import sys
import xml.etree.ElementTree as ET


def main() -> int:
    expected = int(sys.argv[1])
    files = sys.argv[2:]
    rows, total = [], [0, 0, 0, 0]
    for path in files:
        root = ET.parse(path).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        n = [sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")]
        rows.append((path, n))
        total = [a + b for a, b in zip(total, n)]
    print("| partition report | tests | failures | errors | skipped |")
    print("|---|---|---|---|---|")
    for path, n in rows:
        print(f"| {path} | " + " | ".join(map(str, n)) + " |")
    print("| **total** | " + " | ".join(map(str, total)) + " |")
    ok = True
    if len(files) != expected:
        print(f"\n{expected - len(files)} partition report(s) missing")
        ok = False
    if total[1] or total[2]:
        ok = False
    if total[0] == 0:
        print("\nno test ran")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
