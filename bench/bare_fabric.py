"""The floor: a bare Fabric ThreadingGroup running `true` on every host of an inventory
written by `invoke lab.up` (no nodeprep import: just fabric + yaml). With a second argument,
a file holding a POSIX sh script: it runs that instead (base64 through `sh`, as nodeprep
sends its commands), so the floor of "one probe round trip per node" is measured too."""

import base64
import sys

import yaml
from fabric import ThreadingGroup

inv = yaml.safe_load(open(sys.argv[1]))
cmd = "true"
if len(sys.argv) > 2:
    cmd = f"echo {base64.b64encode(open(sys.argv[2], 'rb').read()).decode()} | base64 -d | /bin/sh"
hosts = inv["hosts"]
group = ThreadingGroup(
    *[f"{inv['vars']['user']}@{h['address']}:{h['port']}" for h in hosts.values()],
    connect_kwargs={"key_filename": [inv["vars"]["key"]]},
)
results = group.run(cmd, hide=True)
sys.exit(0 if all(r.ok for r in results.values()) else 1)
