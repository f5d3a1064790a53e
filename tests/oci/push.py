"""Pushes files to an OCI registry with the ORAS project's Python client (PyPI `oras`), for
the plugin supply-chain e2e tests: an OCI client that is not Sluice's.

    push.py REGISTRY REPOSITORY:TAG FILE:MEDIA_TYPE... [--username U --password P]

REGISTRY is host:port (plain HTTP). Prints the pushed manifest's digest.
"""

import argparse
import os
import sys

import oras.client


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("registry")
    parser.add_argument("target")
    parser.add_argument("files", nargs="+")
    parser.add_argument("--username")
    parser.add_argument("--password")
    args = parser.parse_args()

    backend = "basic" if args.username else "token"
    client = oras.client.OrasClient(hostname=args.registry, insecure=True, auth_backend=backend)
    if args.username:
        client.auth.set_basic_auth(args.username, args.password)
    # oras pushes paths relative to the working directory, named by their base name.
    directory = os.path.dirname(os.path.abspath(args.files[0].rsplit(":", 1)[0]))
    os.chdir(directory)
    files = []
    for spec in args.files:
        path, media_type = spec.rsplit(":", 1)
        if os.path.dirname(os.path.abspath(path)) != directory:
            print(f"{path}: every file must be in {directory}", file=sys.stderr)
            return 2
        files.append(f"{os.path.basename(path)}:{media_type}")
    response = client.push(target=f"{args.registry}/{args.target}", files=files, quiet=True)
    if response.status_code not in (200, 201):
        print(f"push failed: {response.status_code} {response.text}", file=sys.stderr)
        return 1
    print(response.headers.get("Docker-Content-Digest", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
