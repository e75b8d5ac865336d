"""`invoke doctor`: what is wrong on the controller and at first contact with the nodes, each
finding with the command that fixes it (health's Finding and Verdict, ops/health/findings.py).

  controller_view.py  what is looked at on the controller (keys, agent, ssh config and its
                 blocks, Python and the tool's pins): the View
  controller.py  the checks over the controller's View
  node.py        first contact: each node's Contact (connection outcome, one probe's facts)
                 and the checks over the fleet's contacts
  connection.py  first contact's connection checks: reach, auth, host_key
  catalogue.py   every check by name, its codes; the selection --check makes
"""
