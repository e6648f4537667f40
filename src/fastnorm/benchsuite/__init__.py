"""Pieces of `fastnorm bench`: what is measured (cases, suites), how (runner, check) and how it is
reported (table, JSON document, PNG chart). `fastnorm.bench` wires them into the command."""
