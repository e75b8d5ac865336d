"""The floor: a bare Fabric ThreadingGroup running `true` on every host of an inventory
written by `invoke lab.up` (no nodeprep import: just fabric + yaml)."""
import sys

import yaml
from fabric import ThreadingGroup

inv = yaml.safe_load(open(sys.argv[1]))
hosts = inv["hosts"]
group = ThreadingGroup(*[f"{inv['vars']['user']}@{h['address']}:{h['port']}" for h in hosts.values()],
                       connect_kwargs={"key_filename": [inv["vars"]["key"]]})
results = group.run("true", hide=True)
sys.exit(0 if all(r.ok for r in results.values()) else 1)
