"""Moving a project and its data to the nodes (issue 48).

fileset.py   a project's files as git sees them (tracked, untracked not ignored), less what
             .nodeprepignore takes out; outside a git repository the same rules from the
             ignore files alone
manifest.py  what one sync moves to one node, from the files here and the node's record of what
             it got: unchanged files not read, deletions only of what nodeprep put there
push.py      one node's sync: what it holds (one round trip), the plan, one tar stream into
             nodeside/syncrecv.py
chained.py   homes whose syncs would send the same, fed one stream passed node to node over
             the mesh (the wheel relay's hop); the per-node sync after it fills any gap
"""
