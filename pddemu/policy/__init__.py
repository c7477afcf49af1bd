"""PDD's decisions that the report leaves open, each a named, configurable policy."""
