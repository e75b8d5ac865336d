#!/usr/bin/env python3
"""An inventory script without _meta whose --host answers are tab-indented JSON, and empty
for one host (Ansible reads nothing as no variables). Written for this corpus."""
import json
import sys

HOSTS = {"hc1": {"ansible_host": "192.0.2.61", "ansible_port": 2261}, "hc2": None,
         "hc3": {"ansible_user": "third"}}

if len(sys.argv) == 2 and sys.argv[1] == "--list":
    print(json.dumps({"calls": {"hosts": ["hc1", "hc2"], "vars": {"ansible_user": "calls"}},
                      "ungrouped": ["hc3"]}, indent="\t"))
elif len(sys.argv) == 3 and sys.argv[1] == "--host":
    found = HOSTS.get(sys.argv[2])
    if found is not None:
        print(json.dumps(found, indent="\t"))
else:
    sys.exit("usage: --list | --host NAME")
