#!/usr/bin/env python3
"""Counts test cases from JUnit XML files (gtest via bazel-testlogs, pytest's
--junitxml) plus extra named checks, prints a failure list and the closing
line `N passed, N failed`, and exits non-zero when anything failed.

Usage: count_results.py [--check NAME=RC ...] XML_OR_DIR ...
"""
import os
import sys
import xml.etree.ElementTree as ET


def xml_files(path):
    if os.path.isdir(path):
        for root, _, files in os.walk(path, followlinks=True):
            for f in files:
                if f == "test.xml" or (f.endswith(".xml") and "junit" in f):
                    yield os.path.join(root, f)
    elif os.path.exists(path):
        yield path


def main(argv):
    passed, failed, skipped, failures = 0, 0, 0, []
    paths = []
    it = iter(argv)
    for a in it:
        if a == "--check":
            name, rc = next(it).rsplit("=", 1)
            if rc == "0":
                passed += 1
            else:
                failed += 1
                failures.append(name)
        else:
            paths.append(a)
    for path in paths:
        for f in xml_files(path):
            try:
                root = ET.parse(f).getroot()
            except ET.ParseError:
                failed += 1
                failures.append(f + " (unreadable XML)")
                continue
            cases = list(root.iter("testcase"))
            if not cases:
                # A test binary that crashed before writing cases: Bazel's
                # generated XML has a <testsuite> with an error.
                for suite in root.iter("testsuite"):
                    if int(suite.get("failures", 0)) or int(suite.get("errors", 0)):
                        failed += 1
                        failures.append(suite.get("name", f))
                continue
            for c in cases:
                name = "%s.%s" % (c.get("classname", ""), c.get("name", ""))
                if c.find("failure") is not None or c.find("error") is not None:
                    failed += 1
                    failures.append(name)
                elif c.find("skipped") is not None or c.get("status") == "notrun":
                    skipped += 1
                else:
                    passed += 1
    for name in failures:
        print("FAILED: " + name)
    line = "%d passed, %d failed" % (passed, failed)
    if skipped:
        line += ", %d skipped" % skipped
    print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
