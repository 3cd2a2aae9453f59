#!/bin/bash
# The job script of grading a class on Slurm: `python -m grader.batch SUBMISSIONS --out DIR --slurm`
# writes it into DIR/slurm/ from this template (or from yours: --template FILE): for the array of
# gradings, for the gather job, and, when a CUDA task is graded, for the job that builds the reference
# kernels once before the gradings. Three marks are filled in: the line of #SBATCH
# options (partition, account, time, GPUs, --sbatch=...), the checkout's folder, and the command.
# Edit the lines between them for your cluster: modules, a conda or venv activation, scratch space.
@SBATCH@

# Your cluster's environment, for example:
# module load cuda/12.4
set -euo pipefail
cd @REPO@
exec @COMMAND@
