"""The cluster suite: trainplan under real SLURM, Open MPI, MPICH and torchrun (see test_real_engines.py)."""
