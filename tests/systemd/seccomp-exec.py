#!/usr/bin/python3
"""Runs a command under the system-call filter of a systemd unit, as systemd would apply it,
for `scripts/package --check` (no systemd runs as PID 1 here, so `systemd-run` cannot).

    seccomp-exec.py UNIT_FILE -- COMMAND [ARGS...]

The unit's SystemCallFilter= lines are expanded with systemd's own group lists
(`systemd-analyze syscall-filter @group`): the first allow list, minus every `~` deny list,
plus what systemd always allows; anything else fails with SystemCallErrorNumber= (EPERM).
Needs Debian's python3-seccomp (libseccomp) and no_new_privs (setpriv --no-new-privs).
"""

import errno
import os
import subprocess
import sys

import seccomp

# systemd.exec(5): allowed whatever an allow list says.
ALWAYS_ALLOWED = {"execve", "exit", "exit_group", "getrlimit", "rt_sigreturn", "sigreturn"}


def expand(item, seen=None):
    """The system calls of `item`: a name, or a @group resolved recursively by systemd."""
    if not item.startswith("@"):
        return {item}
    seen = seen if seen is not None else set()
    if item in seen:
        return set()
    seen.add(item)
    listing = subprocess.run(
        ["systemd-analyze", "syscall-filter", item], check=True, capture_output=True, text=True
    ).stdout
    names = set()
    for line in listing.splitlines()[1:]:
        entry = line.strip()
        if entry and not entry.startswith("#"):
            names |= expand(entry, seen)
    return names


def main():
    unit, sep, command = sys.argv[1], sys.argv[2], sys.argv[3:]
    if sep != "--" or not command:
        print(__doc__, file=sys.stderr)
        return 2
    allowed, denied = None, set()
    for line in open(unit):
        key, _, value = line.strip().partition("=")
        if key != "SystemCallFilter" or not value:
            continue
        deny = value.startswith("~")
        names = set()
        for item in value.lstrip("~").split():
            names |= expand(item)
        if deny:
            denied |= names
        elif allowed is None:
            allowed = names
        else:
            allowed |= names
    if allowed is None:
        print(f"{unit}: no SystemCallFilter allow list", file=sys.stderr)
        return 2
    permitted = (allowed - denied) | ALWAYS_ALLOWED
    rules = seccomp.SyscallFilter(defaction=seccomp.ERRNO(errno.EPERM))
    known = 0
    for name in sorted(permitted):
        try:
            rules.add_rule(seccomp.ALLOW, name)
            known += 1
        except (ValueError, RuntimeError, OSError):
            pass  # not a system call of this architecture
    print(
        f"seccomp: {known} system calls allowed ({len(denied)} denied by ~lists), others EPERM",
        file=sys.stderr,
    )
    rules.load()
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
