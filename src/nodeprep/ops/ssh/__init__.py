"""The ssh mesh: every node logs in to every node with the cluster key and pinned host keys.

  config_blocks.py  the controller's ~/.ssh/config: one managed block per inventory, and the
                    aliases other blocks or the user already define (conflicts)
  logins.py         real logins from a node to its peers (sh that tries them), who logs in to
                    whom, and whether probes ride the head's logins
  paper_mesh.py     every ordered pair checked on paper from each node's authorized_keys,
                    known_hosts and cluster key (N*N pairs for three file reads a node)

CLUSTER_KEY is the one name of the key nodes log in to each other with (a node path; the ssh_keys
role writes it, ssh_config and the relay use it); CLUSTER_KEY_SH is the same path for a shell
that must expand it inside double quotes.
"""

CLUSTER_KEY = "~/.ssh/nodeprep_cluster_ed25519"
CLUSTER_KEY_SH = "$HOME/" + CLUSTER_KEY.removeprefix("~/")
