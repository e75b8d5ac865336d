"""Data staging (`invoke stage`, `train --stage`): a dataset, tokenizer or checkpoint put on
every node's local disk, or each node's shard of it, chained node to node, checked by chunk
as it lands, resumed after an interruption.

  needs.py   the decisions as data: manifest, each node's files and what it lacks, the room,
             the chains
  spec.py    one stage from the command line or the inventory's `stages`
  nodes.py   the node programs put in place; a destination's State, a source's Manifest
  chain.py   the chains run: hop scripts (the wheel relay's chain_hop), the source's feed,
             the progress the nodes report
"""
