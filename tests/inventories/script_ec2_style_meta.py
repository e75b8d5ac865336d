#!/usr/bin/env python3
"""An inventory script in Ansible's script-plugin contract, shaped like a cloud's dynamic
inventory (aws_ec2-style group names, every host's variables in _meta.hostvars, so Ansible
never calls --host). Written for this corpus."""
import json
import sys

HOSTS = {
    "ip-10-0-1-11.ec2.internal": {"ansible_host": "10.0.1.11", "ansible_user": "ubuntu",
                                  "ec2_instance_type": "p4d.24xlarge", "ec2_tag_Role": "gpu"},
    "ip-10-0-1-12.ec2.internal": {"ansible_host": "10.0.1.12", "ansible_user": "ubuntu",
                                  "ec2_instance_type": "p4d.24xlarge", "ec2_tag_Role": "gpu",
                                  "ansible_ssh_common_args": "-o ProxyJump=ec2-user@10.0.0.5:2222"},
    "ip-10-0-0-5.ec2.internal": {"ansible_host": "10.0.0.5", "ansible_port": 2222,
                                 "ansible_user": "ec2-user", "ec2_tag_Role": "login"},
}
INVENTORY = {
    "_meta": {"hostvars": HOSTS},
    "all": {"children": ["aws_ec2", "ungrouped"]},
    "aws_ec2": {"children": ["tag_Role_gpu", "tag_Role_login"], "vars": {"ansible_python_interpreter": "/usr/bin/python3"}},
    "tag_Role_gpu": {"hosts": ["ip-10-0-1-11.ec2.internal", "ip-10-0-1-12.ec2.internal"],
                     "vars": {"ansible_user": "root"}},
    "tag_Role_login": ["ip-10-0-0-5.ec2.internal"],
    "instance_type_p4d_24xlarge": {"hosts": ["ip-10-0-1-11.ec2.internal", "ip-10-0-1-12.ec2.internal"]},
}

if len(sys.argv) == 2 and sys.argv[1] == "--list":
    print(json.dumps(INVENTORY, indent=2))
elif len(sys.argv) == 3 and sys.argv[1] == "--host":
    print(json.dumps(HOSTS.get(sys.argv[2], {})))
else:
    sys.exit("usage: --list | --host NAME")
