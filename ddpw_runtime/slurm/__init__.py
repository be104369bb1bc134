"""The SLURM launcher's runtime: submission and waiting, the sbatch parameters, the controller of each
node, and what the nodes send back."""
