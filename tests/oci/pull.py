"""Pulls an artifact with the ORAS project's Python client (PyPI `oras`) into a directory, for
the plugin supply-chain e2e tests: checks what `sluice plugin push` wrote with a client that
is not Sluice's.

    pull.py REGISTRY REPOSITORY:TAG OUTDIR

REGISTRY is host:port (plain HTTP). Prints each layer's media type and the file it was saved
as (named by its title annotation, or its digest), one per line.
"""

import json
import os
import sys

import oras.client


def main() -> int:
    registry, target, outdir = sys.argv[1:4]
    client = oras.client.OrasClient(hostname=registry, insecure=True)
    manifest = client.get_manifest(f"{registry}/{target}")
    container = client.get_container(f"{registry}/{target}")
    os.makedirs(outdir, exist_ok=True)
    for layer in manifest["layers"]:
        name = layer["digest"].replace(":", "-")
        path = os.path.join(outdir, name)
        client.download_blob(container, layer["digest"], path)
        print(f"{layer['mediaType']} {path}")
    print(f"config {manifest['config']['mediaType']} {json.dumps(manifest['config']['digest'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
