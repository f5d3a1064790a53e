"""Compares a soak run of one language's route-by-aggregate with the Rust reference's.

Usage: compare_soak.py REFERENCE_OUT CANDIDATE_OUT ALLOWED_MEMORY_TRAPS MIN_FIRST_TRAP_ROW

Both files are `sluice plugin test` output (one JSON line per message or failed row). Every
row must come out of the candidate exactly as out of the reference, except that up to
ALLOWED_MEMORY_TRAPS rows may instead fail with the plugin's memory cap (a known guest leak;
see docs/plugin-languages.md), none of them before row MIN_FIRST_TRAP_ROW. Anything else (a
different message, another kind of failure, a missing row, an earlier or extra trap) fails.
Prints one summary line; exits 1 on a mismatch.
"""

import json
import sys


def by_row(path):
    rows = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.setdefault(json.loads(line)["row"], []).append(line)
    return rows


def main():
    reference_path, candidate_path, allowed, min_row = sys.argv[1:5]
    allowed, min_row = int(allowed), int(min_row)
    reference, candidate = by_row(reference_path), by_row(candidate_path)
    traps, problems = [], []
    for row, expected in reference.items():
        got = candidate.get(row)
        if got == expected:
            continue
        if got and len(got) == 1:
            failure = json.loads(got[0])
            if failure.get("kind") == "trap" and "memory limit" in failure.get("error", ""):
                traps.append(row)
                continue
        problems.append(f"row {row}: expected {expected!r}, got {got!r}")
    extra = sorted(set(candidate) - set(reference))
    if extra:
        problems.append(f"rows the reference did not output: {extra[:5]}")
    if len(traps) > allowed:
        problems.append(f"{len(traps)} memory traps (rows {traps[:10]}); at most {allowed} allowed")
    early = [row for row in traps if row < min_row]
    if early:
        problems.append(f"memory trap at row {early[0]}, before row {min_row}: the leak got worse")
    summary = (
        f"{len(reference)} rows, {len(traps)} memory trap(s)"
        + (f" at row(s) {traps}" if traps else "")
        + f" (allowed {allowed})"
    )
    if problems:
        print(f"FAILED: {summary}")
        for p in problems[:20]:
            print(f"  {p[:400]}")
        sys.exit(1)
    if len(traps) < allowed:
        summary += "; fewer than allowed: lower the allowance in tests/conformance/run"
    print(f"ok: {summary}")


if __name__ == "__main__":
    main()
