"""Test helpers shipped with the package: the process harness and the fakes."""
