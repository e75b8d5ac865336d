"""Moving a project and its data to the nodes (issue 48).

fileset.py   a project's files as git sees them (tracked, untracked not ignored), less what
             .nodeprepignore takes out; outside a git repository the same rules from the
             ignore files alone
"""
