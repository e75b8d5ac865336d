"""The inventory layer, pure data (no ssh): every format users already have, read into one
validated Inventory.

  reader.py     which form (--inventory NAME, a path, hostfile:, slurm:, sshconfig:, ...) is
                read how
  sources.py    the native YAML format, group_vars/ and host_vars/
  ansible.py    Ansible YAML inventories (with addresses.py: hosts, ports, ranges, group order)
  ini.py        Ansible INI inventories
  dynamic.py    Ansible's dynamic inventories: inventory scripts and what they print (.json,
                `ansible-inventory --list`)
  hostfiles.py  DeepSpeed, Open MPI, MPICH hostfiles, PBS nodefiles, Slurm node lists
  sshconfig.py  `sshconfig:`: the Host aliases of ~/.ssh/config as nodes, with OpenSSH's values
  sshconfig_files.py  a client config read as ssh reads it: words, comments, Include, the names
  openssh.py    OpenSSH's own answer for a host (`ssh -G`), many at once, and its refusals
  jumps.py      jump hosts (bastions) from proxy_jump, Ansible's ssh arguments, the ssh config
  connvars.py   every Ansible ssh-connection variable: used (as what), ignored (why) or refused
                (the fix)
  dsfilter.py   DeepSpeed's --include/--exclude strings as --limit: nodes and slots
  yamlfile.py   YAML read with file:line for every value, one-line errors
  jsonfile.py   JSON read as Ansible reads it (script output; a file: JSON first, else YAML),
                with file:line
  writer.py     the native format written (invoke init): commented hosts.yml, values literal
  schema.py     the variables (defaults.yml) and their types
  fields.py     what names, addresses, users and values may contain
  nodeset.py    node sets such as worker-[0-7], folded and expanded
  model.py      the validated Inventory: hosts, groups, variable precedence, origins
"""

from nodeprep.inventory.model import Host, Inventory, load

__all__ = ["Host", "Inventory", "load"]
