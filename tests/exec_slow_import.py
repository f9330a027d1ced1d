"""A python executor target whose import blocks until exec_targets.IMPORT_GATE is set."""
import exec_targets

exec_targets.IMPORT_GATE.wait(30)


def imported(ctx):
    return "imported"
