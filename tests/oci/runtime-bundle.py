#!/usr/bin/python3
"""Prepares the OCI runtime bundle `umoci unpack` wrote from Sluice's image to run one command
under runc the way a restrictive runtime runs a pod (`scripts/package --check image`).

    runtime-bundle.py BUNDLE --user UID:GID --seccomp PROFILE [--env NAME=VALUE]...
                      [--mount SOURCE:DESTINATION]... [-- ARGS...]

BUNDLE/config.json keeps what the image says (its arguments, environment, user, working
directory: umoci derived them from the image's configuration); the image's own configuration is
kept the first time as config.image.json and every call starts from it. Then:
- the process runs ARGS (the image's entrypoint and command without them), with the image's
  environment plus each --env, and each --mount's host file or directory read-only at its
  DESTINATION;
- the image's user must be UID:GID (exits non-zero naming both otherwise);
- no capabilities, no_new_privs, a read-only root, empty tmpfs at /tmp and /var/cache/sluice
  (Kubernetes: readOnlyRootFilesystem, capabilities drop ALL, an emptyDir for the cache);
- the system-call filter PROFILE, a profile in Docker's format (podman's and CRI-O's default:
  /usr/share/containers/seccomp.json), resolved for this architecture and no capabilities
  the way those runtimes resolve it;
- the host's network namespace, so the container reaches services on 127.0.0.1.
"""

import argparse
import json
import os
import platform
import re
import shutil
import sys

# By Python's machine name: the profile's (and the runtime spec's) architecture, and the name
# a profile's includes/excludes use for it.
PROFILE_ARCH = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}
GO_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def kernel_at_least(minimum):
    """Whether the running kernel is `minimum` ("5.8") or newer."""
    running = [int(n) for n in re.findall(r"\d+", platform.release())[:2]]
    return running >= [int(n) for n in minimum.split(".")[:2]]


def seccomp_for(profile, machine):
    """The runtime spec's linux.seccomp for a Docker-format profile, for a process without
    capabilities on `machine` (entries that need a capability, another architecture or a newer
    kernel drop out, entries excluded only for holders of a capability stay)."""
    native = PROFILE_ARCH[machine]
    arches = [native]
    for entry in profile.get("archMap") or []:
        if entry["architecture"] == native:
            arches += entry.get("subArchitectures") or []
    go_arch = GO_ARCH[machine]
    syscalls = []
    for rule in profile["syscalls"]:
        includes, excludes = rule.get("includes") or {}, rule.get("excludes") or {}
        if includes.get("caps"):
            continue
        if includes.get("minKernel") and not kernel_at_least(includes["minKernel"]):
            continue
        if includes.get("arches") and go_arch not in includes["arches"]:
            continue
        if go_arch in (excludes.get("arches") or []):
            continue
        converted = {"names": rule["names"], "action": rule["action"]}
        if rule.get("args"):
            converted["args"] = rule["args"]
        if rule.get("errnoRet") is not None:
            converted["errnoRet"] = rule["errnoRet"]
        syscalls.append(converted)
    seccomp = {
        "defaultAction": profile["defaultAction"],
        "architectures": arches,
        "syscalls": syscalls,
    }
    if profile.get("defaultErrnoRet") is not None:
        seccomp["defaultErrnoRet"] = profile["defaultErrnoRet"]
    return seccomp


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--user", required=True)
    parser.add_argument("--seccomp", required=True)
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--mount", action="append", default=[])
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    options = parser.parse_args(argv[:split])
    options.args = argv[split + 1 :]

    config_path = os.path.join(options.bundle, "config.json")
    image_path = os.path.join(options.bundle, "config.image.json")
    if not os.path.exists(image_path):
        shutil.copyfile(config_path, image_path)
    with open(image_path) as f:
        config = json.load(f)

    process = config["process"]
    user = f"{process['user']['uid']}:{process['user']['gid']}"
    if user != options.user:
        sys.exit(f"the image runs as {user}, not {options.user}")
    if options.args:
        process["args"] = options.args
    process["env"] = process.get("env", []) + options.env
    process["terminal"] = False
    process["noNewPrivileges"] = True
    process["capabilities"] = {
        kind: [] for kind in ("bounding", "effective", "inheritable", "permitted", "ambient")
    }
    config["root"]["readonly"] = True
    uid, gid = options.user.split(":")
    config["mounts"] += [
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "mode=1777"]},
        {"destination": "/var/cache/sluice", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "mode=0750", f"uid={uid}", f"gid={gid}"]},
    ]
    for mount in options.mount:
        source, destination = mount.split(":", 1)
        config["mounts"].append({"destination": destination, "type": "bind",
                                 "source": os.path.abspath(source),
                                 "options": ["bind", "ro", "nosuid", "nodev"]})
    linux = config["linux"]
    linux["namespaces"] = [ns for ns in linux["namespaces"] if ns["type"] != "network"]
    with open(options.seccomp) as f:
        linux["seccomp"] = seccomp_for(json.load(f), platform.machine())

    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)


if __name__ == "__main__":
    main()
