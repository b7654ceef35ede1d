"""Plans and rules written out for people and other tools: the compatibility matrix (`matrix`), a plan as a
torchrun line, a SLURM script or a Kubeflow job (`emit`), a request spelled back (`spelling`), and the bug report's
text (`report`).

Pure: text and plain data from records and rules, never the machine.
"""
