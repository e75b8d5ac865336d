"""How `provision` runs the roles under roles/ (one folder each, outside the package).

roles.py      the role loader (roles/site.yml order), Provisioning (what one run knows about
              the fleet), Shared (values one role computes once and others read), Ctx
topology.py   which inventory nodes share a machine or a home (from the IDENTITY fact), who
              acts for a shared group
room.py       whether a node has room for what provision writes (space, inodes, a
              read-only or unwritable file system), and the reason in numbers
shells.py     the login shell the shell role sets (doctor asks whether sudo can set it)
"""
