"""The torch build for a fleet: one answer per CPU platform, all of the same torch release.

  torch_matrix.yml  the facts: wheels per release x platform x variant, driver minimums,
                    GPU generations, each with its source
  data.py           reading those facts
  nodes.py          the fleet's nodes as the plan sees them (from the `gpus` fact or --node specs),
                    and the variant a loaded cuda module names
  generations.py    step 1: the nodes' GPU facts usable, each GPU's generation on its driver
  rule.py           per platform: which wheels fit its drivers and GPUs, and why none does
  plan.py           the order the rule is applied in, and the Plan

`from nodeprep.ops import torchplan` gives the public names (torchplan.choose, .Plan, ...).
"""

from nodeprep.ops.torchplan.plan import (
    ARCH_ALIASES,
    DEFAULT_INDEX,
    SPEC_SYNTAX,
    Build,
    NodeGPU,
    Plan,
    PlanError,
    choose,
    covers,
    cuda_variant_of_modules,
    evaluate,
    from_pip_config,
    merged,
    node_from_facts,
    parse_node_spec,
)

__all__ = [
    "ARCH_ALIASES",
    "DEFAULT_INDEX",
    "SPEC_SYNTAX",
    "Build",
    "NodeGPU",
    "Plan",
    "PlanError",
    "choose",
    "covers",
    "cuda_variant_of_modules",
    "evaluate",
    "from_pip_config",
    "merged",
    "node_from_facts",
    "parse_node_spec",
]
