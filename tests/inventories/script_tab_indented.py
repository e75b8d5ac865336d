#!/usr/bin/env python3
"""An inventory script that prints its JSON indented with tabs (json.dumps(indent="\t")):
valid JSON, invalid YAML; Ansible parses a script's output as JSON. Written for this corpus."""
import json
import sys

HOSTS = {
    "tab01": {"ansible_host": "198.51.100.11", "ansible_user": "tabs"},
    "tab02": {"ansible_host": "198.51.100.12", "ansible_port": 2212},
}
INVENTORY = {"_meta": {"hostvars": HOSTS},
             "all": {"children": ["ungrouped", "tabbed"]},
             "tabbed": {"hosts": ["tab01", "tab02"], "vars": {"ansible_python_interpreter": "/usr/bin/python3"}}}

if len(sys.argv) == 2 and sys.argv[1] == "--list":
    print(json.dumps(INVENTORY, indent="\t"))
elif len(sys.argv) == 3 and sys.argv[1] == "--host":
    print(json.dumps(HOSTS.get(sys.argv[2], {}), indent="\t"))
else:
    sys.exit("usage: --list | --host NAME")
