"""The device half of a recipe in static shapes, and captured as a CUDA graph.

The ops over the whole batch (:mod:`.static`), the half in static shapes (:mod:`.half`) and its CUDA-graph capture
(:mod:`.captured`): bit-equal to the eager path on the CPU, to be proven and made the CUDA default on a GPU.
"""
