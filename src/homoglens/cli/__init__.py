r"""The ``homoglens`` command.

homoglens profile --model smollm2-135m-instruct --corpus austen --n-seq 64 --seq-len 256 \\
        --out homoglens-report
homoglens ablate --modes none,zero,permute --out ablation-report
homoglens sinks --sink-top-k 4 --out sinks-report
homoglens patch --component head --metrics mean_pairwise,loss --out patching-report
homoglens compare --out comparison-report
"""

from homoglens.cli.commands import main

__all__ = ["main"]
