#!/usr/bin/env python3
"""An inventory script whose _meta.hostvars names hosts that no group lists (a cloud
script that lists stopped instances' variables but groups only running ones): Ansible takes
only the hosts a group lists. Written for this corpus."""
import json
import sys

HOSTS = {
    "run01": {"ansible_host": "192.0.2.31"},
    "stopped01": {"ansible_host": "192.0.2.41"},
    "stopped02": {"ansible_host": "192.0.2.42", "ansible_user": "root"},
}
INVENTORY = {"_meta": {"hostvars": HOSTS},
             "all": {"children": ["ungrouped", "running"]},
             "running": {"hosts": ["run01"]}}

if len(sys.argv) == 2 and sys.argv[1] == "--list":
    print(json.dumps(INVENTORY, indent=2))
elif len(sys.argv) == 3 and sys.argv[1] == "--host":
    print(json.dumps(HOSTS.get(sys.argv[2], {})))
else:
    sys.exit("usage: --list | --host NAME")
