"""``python -m homoglens.cli`` (what ``torchrun -m homoglens.cli`` runs)."""

from homoglens.cli.commands import main

main()
