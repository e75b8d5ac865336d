#!/bin/sh
# An inventory script without _meta: Ansible then asks it for each host's variables with
# --host NAME (the script plugin's older contract). Written for this corpus.
case "$1" in
--list)
    cat <<'JSON'
{"gpus": {"hosts": ["gpu01", "gpu02"], "vars": {"ansible_user": "train"}},
 "login": ["login01"],
 "cluster": {"children": ["gpus", "login"]}}
JSON
    ;;
--host)
    case "$2" in
    gpu01) echo '{"ansible_host": "192.0.2.11"}' ;;
    gpu02) echo '{"ansible_host": "192.0.2.12", "ansible_port": "2201"}' ;;
    login01) echo '{"ansible_host": "192.0.2.10", "ansible_user": "ops"}' ;;
    *) echo '{}' ;;
    esac
    ;;
*) echo "usage: --list | --host NAME" >&2; exit 2 ;;
esac
