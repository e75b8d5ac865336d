#!/bin/sh
# An inventory script that prints YAML, not JSON: Ansible parses a script's output as JSON
# only, and refuses it. Written for this corpus.
case "$1" in
--list) printf 'all:\n  hosts:\n    y1:\n      ansible_host: 192.0.2.71\n' ;;
*) echo '{}' ;;
esac
