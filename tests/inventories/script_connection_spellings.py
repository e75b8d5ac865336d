#!/usr/bin/env python3
"""An inventory script (Ansible's script-plugin contract) whose _meta.hostvars use both
spellings of the ssh connection's variables: Ansible's ssh connection takes the last of an
option's vars that is defined (ansible_ssh_user over ansible_user, ...). Written for this
corpus."""
import json
import sys

HOSTS = {
    "d1": {"ansible_host": "10.2.0.1", "ansible_user": "weak", "ansible_ssh_user": "strong",
           "ansible_private_key_file": "/keys/d1"},
    "d2": {"ansible_ssh_host": "10.2.0.2", "ansible_port": 2200, "ansible_ssh_port": 2222,
           "ansible_ssh_private_key_file": "/keys/d2", "ansible_private_key_file": "/keys/ignored",
           "ansible_python_interpreter": "/usr/bin/python3.11"},
}
INVENTORY = {"_meta": {"hostvars": HOSTS}, "all": {"children": ["ungrouped", "dyn"]},
             "dyn": {"hosts": ["d1", "d2"], "vars": {"ansible_ssh_user": "group-strong"}}}

if len(sys.argv) == 2 and sys.argv[1] == "--list":
    print(json.dumps(INVENTORY, indent=2))
elif len(sys.argv) == 3 and sys.argv[1] == "--host":
    print(json.dumps(HOSTS.get(sys.argv[2], {})))
