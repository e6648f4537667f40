"""`fastnorm bench`: what is measured (cases, suites), how (runner, check), how it is reported (table,
JSON document, charts) and the command that wires them together (cli)."""
