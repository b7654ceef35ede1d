"""A plan in other vocabularies, pure: the variables trainplan's workers are started with (`workers`), and the
arguments of the frameworks and engines a plan runs under, Lightning, Fabric, Accelerate and DeepSpeed (`frameworks`).
"""
