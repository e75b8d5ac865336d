#!/bin/sh
# An inventory script that fails (a cloud API without credentials): Ansible refuses the
# inventory, and so must nodeprep, naming the script and what it said. Written for this corpus.
echo "Unable to locate credentials. You can configure credentials by running \"aws configure\"." >&2
exit 1
