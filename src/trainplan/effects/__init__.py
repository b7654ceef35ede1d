"""The effects layer: everything that touches the world (probing, CUDA, processes, collectives).

Thin by rule: it gathers facts and carries out a plan's decisions, and decides nothing that
`trainplan.resolve` could decide from facts. Importing it does not import torch.
"""

from trainplan.effects.probe import GpuInventory, NvmlInventory, ProbeError, probe

__all__ = ["GpuInventory", "NvmlInventory", "ProbeError", "probe"]
