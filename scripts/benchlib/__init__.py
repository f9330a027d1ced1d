"""The benchmark's parts (scripts/bench.py is the entry): the clusters over the package's process
harness, the registrar, one module per scenario, the checks, the report and the command line.

Importing the package imports nothing else: the state-machine child runs one module of it
against code that may predate the harness."""
