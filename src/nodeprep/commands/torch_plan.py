"""`invoke torch-plan`: which torch build fits a fleet, offline (no node is contacted).

Pick the torch wheel (CUDA variant) for every node, one answer per CPU platform, all of the
same torch release: each GPU's generation must run on its own driver (Blackwell R570+), then per
platform the wheels published for it, runnable by its oldest driver, compiled for every GPU
there (PTX only where the wheel carries it); a variant that fits every platform wins, newest
first (ops/torchplan/plan.py). The result is per platform the variant, the exact pip pin with its
index URL, whether it runs by minor-version compatibility, and why the other variants were
dropped; or the node that blocks, why, and what would fix it (a supported driver branch, or
released torch versions that fit). `--explain` adds the table rows and rule steps, with sources.

  --node NAME:driver=535.104.05,gpu=8.0   one GPU of compute capability 8.0 (or gpu=A100)
  --node NAME:driver=...,gpu=8.0+9.0      several GPUs; gpus=8x8.0 for eight alike
  --node NAME:cpu                         a CPU-only node (needs the same wheel, no GPU checks)
  add arch=aarch64 to a node, or --arch for all nodes without one (default x86_64).
  --module cuda/12.6 (repeatable): the modules the fleet loads, as the inventory's `modules`;
  a CUDA toolkit module's variant (cu126) is taken where it fits, as provision takes it.
  --index: URL template with {variant} (default https://download.pytorch.org/whl/{variant}).
  --explain: the table rows and rule steps behind the answer, with their sources.
Exit 0 when a build fits, 1 when none does, 2 on bad input."""

from __future__ import annotations

from dataclasses import dataclass

from nodeprep.commands.options import TorchPlanOptions
from nodeprep.errors import InputError, NodeprepError
from nodeprep.ops import torchplan


@dataclass
class TorchPlanResult:
    json: bool
    plan: torchplan.Plan | None = None
    error: NodeprepError | None = None  # no build fits (PlanError) or bad --node input

    @property
    def exit_code(self) -> int:
        return self.error.exit_code if self.error else 0


def torch_plan(opts: TorchPlanOptions) -> TorchPlanResult:
    """The error is part of the result (not raised): --json reports it as data."""
    try:
        if opts.arch is not None and opts.arch not in torchplan.ARCH_ALIASES:
            raise InputError(f"--arch: expected x86_64 or aarch64, got {opts.arch!r}")
        nodes = [torchplan.parse_node_spec(s, opts.arch or "x86_64") for s in opts.nodes]
        dup = [n.name for i, n in enumerate(nodes) if n.name in [m.name for m in nodes[:i]]]
        if dup:
            raise InputError(f"--node: {dup[0]} given twice")
        prefer = torchplan.cuda_variant_of_modules(list(opts.modules))
        plan = torchplan.choose(
            opts.torch, nodes, opts.index or torchplan.DEFAULT_INDEX, prefer=prefer
        )
        if opts.modules and prefer is None:
            plan.explain.append(
                f"--module {', '.join(opts.modules)}: no CUDA toolkit module among them "
                "(cuda/X.Y, cudatoolkit/X.Y, cuda-toolkit/X.Y): the rule's pick stands"
            )
    except NodeprepError as e:
        return TorchPlanResult(opts.json, error=e)
    return TorchPlanResult(opts.json, plan=plan)
